set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-kjv.png'
set title 'Eval loss vs tokens (kjv, plan full)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/baseline-dp.dat' using ($1/1e6):2 with linespoints title 'baseline: data parallel, batch 64' lw 3 lc rgb 'black', 'plot-data/warm-k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int8', 'plot-data/warm-k4-h50-int4.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int4', 'plot-data/warm-k4-h50-topk64-down256-sgd.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 64/4096 up, 256/4096 down, outer SGD lr 2', 'plot-data/warm-k4-h50-topk64-down256-sgd-ef0.9.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 64/4096 up, 256/4096 down, outer SGD lr 2, EF decay 0.9', 'plot-data/warm-k4-h50-topk64-sgd.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 64/4096 both ways, outer SGD lr 1'
set output 'loss-vs-bytes-kjv.png'
set title 'Eval loss vs bytes communicated (kjv)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/baseline-dp.dat' using 3:2 with linespoints title 'baseline: data parallel, batch 64' lw 3 lc rgb 'black', 'plot-data/warm-k4-h50-int8.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int8', 'plot-data/warm-k4-h50-int4.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int4', 'plot-data/warm-k4-h50-topk64-down256-sgd.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 64/4096 up, 256/4096 down, outer SGD lr 2', 'plot-data/warm-k4-h50-topk64-down256-sgd-ef0.9.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 64/4096 up, 256/4096 down, outer SGD lr 2, EF decay 0.9', 'plot-data/warm-k4-h50-topk64-sgd.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 64/4096 both ways, outer SGD lr 1'
unset logscale x
