set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-kjv.png'
set title 'Eval loss vs tokens (kjv, plan topk)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'DiLoCo K=4 H=50 int8', 'plot-data/k4-h50-topk176-down640-sgd-lr2-ef0.8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 2), EF decay 0.8', 'plot-data/k4-h50-topk176-down640-sgd-lr4to2-ef0.8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 4 falling linearly to 2 at the last round), EF decay 0.8', 'plot-data/k4-h50-topk176-relay-sgd-lr4to2-ef0.8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 topk 176/4096 up, the uplink frames relayed down (exact), outer SGD (momentum 0, lr 4 falling linearly to 2 at the last round), EF decay 0.8', 'plot-data/k4-h50-topk176-down640-sgd-lr3to1.5-ef0.8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 3 falling linearly to 1.5 at the last round), EF decay 0.8', 'plot-data/k4-h50-topk176-down640-sgd-lr6to2-ef0.8.dat' using ($1/1e6):2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 6 falling linearly to 2 at the last round), EF decay 0.8'
set output 'loss-vs-bytes-kjv.png'
set title 'Eval loss vs bytes communicated (kjv)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/k4-h50-int8.dat' using 3:2 with linespoints title 'DiLoCo K=4 H=50 int8', 'plot-data/k4-h50-topk176-down640-sgd-lr2-ef0.8.dat' using 3:2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 2), EF decay 0.8', 'plot-data/k4-h50-topk176-down640-sgd-lr4to2-ef0.8.dat' using 3:2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 4 falling linearly to 2 at the last round), EF decay 0.8', 'plot-data/k4-h50-topk176-relay-sgd-lr4to2-ef0.8.dat' using 3:2 with linespoints title 'K=4 H=50 topk 176/4096 up, the uplink frames relayed down (exact), outer SGD (momentum 0, lr 4 falling linearly to 2 at the last round), EF decay 0.8', 'plot-data/k4-h50-topk176-down640-sgd-lr3to1.5-ef0.8.dat' using 3:2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 3 falling linearly to 1.5 at the last round), EF decay 0.8', 'plot-data/k4-h50-topk176-down640-sgd-lr6to2-ef0.8.dat' using 3:2 with linespoints title 'K=4 H=50 topk 176/4096 up, 640/4096 down, outer SGD (momentum 0, lr 6 falling linearly to 2 at the last round), EF decay 0.8'
unset logscale x
