set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-mixed.png'
set title 'Eval loss vs tokens (mixed, plan overlap)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/equal.dat' using ($1/1e6):2 with linespoints title 'K=4 equal speeds, H=50', 'plot-data/mixed-fixed.dat' using ($1/1e6):2 with linespoints title 'provider-3 4x slower, fixed H=50', 'plot-data/mixed-budget.dat' using ($1/1e6):2 with linespoints title 'provider-3 4x slower, 15 s time-budgeted rounds, delayed (fold after 8 steps)'
set output 'loss-vs-bytes-mixed.png'
set title 'Eval loss vs bytes communicated (mixed)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/equal.dat' using 3:2 with linespoints title 'K=4 equal speeds, H=50', 'plot-data/mixed-fixed.dat' using 3:2 with linespoints title 'provider-3 4x slower, fixed H=50', 'plot-data/mixed-budget.dat' using 3:2 with linespoints title 'provider-3 4x slower, 15 s time-budgeted rounds, delayed (fold after 8 steps)'
unset logscale x
set output 'utilization-vs-bandwidth.png'
set title 'Least busy provider vs link bandwidth'
set xlabel 'per-provider link rate, Mbit/s (log)'
set logscale x
set ylabel 'inner compute / (compute + waiting) (%)'
set yrange [*:100.5]
set key bottom right
plot 'plot-data/utilization-0.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap none', 'plot-data/utilization-1.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap delayed', 'plot-data/utilization-2.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap delayed, folded on arrival', 'plot-data/utilization-3.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap none, keep_local 0.5', 'plot-data/utilization-4.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, delayed, folded on arrival, keep_local 0.5', 97 dt 2 lc rgb 'red' title '97 %'
