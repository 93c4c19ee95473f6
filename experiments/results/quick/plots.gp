set terminal pngcairo size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-kjv.png'
set title 'Eval loss vs tokens (kjv, plan quick)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/baseline-dp.dat' using ($1/1e6):2 with linespoints title 'baseline: data parallel, batch 64' lw 3 lc rgb 'black', 'plot-data/k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'DiLoCo K=4 H=50 int8', 'plot-data/k2-h50-int8.dat' using ($1/1e6):2 with linespoints title 'K=2 H=50 int8', 'plot-data/k8-h50-int8.dat' using ($1/1e6):2 with linespoints title 'K=8 H=50 int8', 'plot-data/k4-h10-int8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=10 int8', 'plot-data/k4-h200-int8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=200 int8', 'plot-data/k4-h50-fp32.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 fp32', 'plot-data/k4-h50-int4.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 int4', 'plot-data/k4-h50-int8-books.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 int8, books (non-IID)', 'plot-data/warm-k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int8', 'plot-data/kill-k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 int8, one provider killed at 50%'
set output 'loss-vs-bytes-kjv.png'
set title 'Eval loss vs bytes communicated (kjv)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/baseline-dp.dat' using 3:2 with linespoints title 'baseline: data parallel, batch 64' lw 3 lc rgb 'black', 'plot-data/k4-h50-int8.dat' using 3:2 with linespoints title 'DiLoCo K=4 H=50 int8', 'plot-data/k2-h50-int8.dat' using 3:2 with linespoints title 'K=2 H=50 int8', 'plot-data/k8-h50-int8.dat' using 3:2 with linespoints title 'K=8 H=50 int8', 'plot-data/k4-h10-int8.dat' using 3:2 with linespoints title 'K=4 H=10 int8', 'plot-data/k4-h200-int8.dat' using 3:2 with linespoints title 'K=4 H=200 int8', 'plot-data/k4-h50-fp32.dat' using 3:2 with linespoints title 'K=4 H=50 fp32', 'plot-data/k4-h50-int4.dat' using 3:2 with linespoints title 'K=4 H=50 int4', 'plot-data/k4-h50-int8-books.dat' using 3:2 with linespoints title 'K=4 H=50 int8, books (non-IID)', 'plot-data/warm-k4-h50-int8.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int8', 'plot-data/kill-k4-h50-int8.dat' using 3:2 with linespoints title 'K=4 H=50 int8, one provider killed at 50%'
unset logscale x
set output 'loss-vs-tokens-fmnist.png'
set title 'Eval loss vs tokens (fmnist, plan quick)'
set xlabel 'images (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/fm-baseline-dp.dat' using ($1/1e6):2 with linespoints title 'baseline: data parallel, batch 64' lw 3 lc rgb 'black', 'plot-data/fm-k4-h50-int8-iid.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 int8 iid', 'plot-data/fm-k4-h50-int8-dirichlet.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 int8 dirichlet(0.5)'
set output 'loss-vs-bytes-fmnist.png'
set title 'Eval loss vs bytes communicated (fmnist)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/fm-baseline-dp.dat' using 3:2 with linespoints title 'baseline: data parallel, batch 64' lw 3 lc rgb 'black', 'plot-data/fm-k4-h50-int8-iid.dat' using 3:2 with linespoints title 'K=4 H=50 int8 iid', 'plot-data/fm-k4-h50-int8-dirichlet.dat' using 3:2 with linespoints title 'K=4 H=50 int8 dirichlet(0.5)'
unset logscale x
set output 'utilization-vs-bandwidth.png'
set title 'Compute utilization vs link bandwidth (K=4, H=50, int8)'
set xlabel 'per-provider link rate, Mbit/s (log)'
set logscale x
set ylabel 'inner compute / wall (%)'
set yrange [*:100]
unset key
plot 'plot-data/utilization.dat' using 1:2 with linespoints lw 2 pt 7, 97 dt 2 lc rgb 'red'
