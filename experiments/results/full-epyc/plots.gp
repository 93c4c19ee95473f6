set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-kjv.png'
set title 'Eval loss vs tokens (kjv, plan full)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/warm-k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int8', 'plot-data/warm-k4-h50-int8-seed2.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int8, seed 2', 'plot-data/warm-k4-h50-int8-olr1-m0.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int8, plain averaging (outer lr 1, no momentum)', 'plot-data/warm-k4-h50-int8-olr2-m0.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 int8, outer SGD lr 2, no momentum', 'plot-data/warm-k4-h50-topk176-down640-sgd-lr4-ef0.8.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD lr 4, EF decay 0.8', 'plot-data/warm-k4-h50-topk176-down640-sgd-lr4-ef0.8-seed2.dat' using ($1/1e6):2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD lr 4, EF decay 0.8, seed 2'
set output 'loss-vs-bytes-kjv.png'
set title 'Eval loss vs bytes communicated (kjv)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/warm-k4-h50-int8.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int8', 'plot-data/warm-k4-h50-int8-seed2.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int8, seed 2', 'plot-data/warm-k4-h50-int8-olr1-m0.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int8, plain averaging (outer lr 1, no momentum)', 'plot-data/warm-k4-h50-int8-olr2-m0.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 int8, outer SGD lr 2, no momentum', 'plot-data/warm-k4-h50-topk176-down640-sgd-lr4-ef0.8.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD lr 4, EF decay 0.8', 'plot-data/warm-k4-h50-topk176-down640-sgd-lr4-ef0.8-seed2.dat' using 3:2 with linespoints title 'warm start at 1/3, K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD lr 4, EF decay 0.8, seed 2'
unset logscale x
