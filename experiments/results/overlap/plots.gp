set terminal pngcairo size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-mixed.png'
set title 'Eval loss vs tokens (mixed, plan overlap)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/mixed-fixed.dat' using ($1/1e6):2 with linespoints title 'provider-3 4x slower, fixed H=50'
set output 'loss-vs-bytes-mixed.png'
set title 'Eval loss vs bytes communicated (mixed)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/mixed-fixed.dat' using 3:2 with linespoints title 'provider-3 4x slower, fixed H=50'
unset logscale x
