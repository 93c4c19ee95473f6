set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'utilization-vs-bandwidth.png'
set title 'Least busy provider vs link bandwidth'
set xlabel 'per-provider link rate, Mbit/s (log)'
set logscale x
set ylabel 'inner compute / (compute + waiting) (%)'
set yrange [*:100.5]
set key bottom right
plot 'plot-data/utilization-0.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap none, keep_local 0.5, outer momentum 0.8', 'plot-data/utilization-1.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, delayed, folded on arrival, keep_local 0.5, outer momentum 0.8', 'plot-data/utilization-2.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap none, keep_local 0.5, outer momentum 0.8, each provider capped at 0.45 CPU', 'plot-data/utilization-3.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, delayed, folded on arrival, keep_local 0.5, outer momentum 0.8, each provider capped at 0.45 CPU', 'plot-data/utilization-4.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, overlap none, keep_local 0.5, outer momentum 0.8, each provider capped at 0.45 CPU, one OpenBLAS thread per provider', 'plot-data/utilization-5.dat' using 1:2 with linespoints lw 2 pt 7 title 'K=4 H=50 int8, delayed, folded on arrival, keep_local 0.5, outer momentum 0.8, each provider capped at 0.45 CPU, one OpenBLAS thread per provider', 97 dt 2 lc rgb 'red' title '97 %'
