set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-loss.png'
set title 'Eval loss vs tokens (loss, plan recipes)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/lan-s7.dat' using ($1/1e6):2 with linespoints title 'recipe lan (int8, fixed H=50), seed 7, loopback', 'plot-data/lan-s8.dat' using ($1/1e6):2 with linespoints title 'recipe lan (int8, fixed H=50), seed 8, loopback', 'plot-data/lan-s9.dat' using ($1/1e6):2 with linespoints title 'recipe lan (int8, fixed H=50), seed 9, loopback', 'plot-data/wan-sparse-s7.dat' using ($1/1e6):2 with linespoints title 'recipe wan-sparse (topk 176/4096 + relay clipped), seed 7, loopback', 'plot-data/wan-sparse-s8.dat' using ($1/1e6):2 with linespoints title 'recipe wan-sparse (topk 176/4096 + relay clipped), seed 8, loopback', 'plot-data/wan-sparse-s9.dat' using ($1/1e6):2 with linespoints title 'recipe wan-sparse (topk 176/4096 + relay clipped), seed 9, loopback'
set output 'loss-vs-bytes-loss.png'
set title 'Eval loss vs bytes communicated (loss)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/lan-s7.dat' using 3:2 with linespoints title 'recipe lan (int8, fixed H=50), seed 7, loopback', 'plot-data/lan-s8.dat' using 3:2 with linespoints title 'recipe lan (int8, fixed H=50), seed 8, loopback', 'plot-data/lan-s9.dat' using 3:2 with linespoints title 'recipe lan (int8, fixed H=50), seed 9, loopback', 'plot-data/wan-sparse-s7.dat' using 3:2 with linespoints title 'recipe wan-sparse (topk 176/4096 + relay clipped), seed 7, loopback', 'plot-data/wan-sparse-s8.dat' using 3:2 with linespoints title 'recipe wan-sparse (topk 176/4096 + relay clipped), seed 8, loopback', 'plot-data/wan-sparse-s9.dat' using 3:2 with linespoints title 'recipe wan-sparse (topk 176/4096 + relay clipped), seed 9, loopback'
unset logscale x
set output 'loss-vs-tokens-unequal.png'
set title 'Eval loss vs tokens (unequal, plan recipes)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/lan-slow3-s7.dat' using ($1/1e6):2 with linespoints title 'recipe lan, provider-3 2x slower (XLOCO_THROTTLE), seed 7', 'plot-data/unequal-slow3-s7.dat' using ($1/1e6):2 with linespoints title 'recipe unequal (17 s budget, delayed), provider-3 2x slower, seed 7', 'plot-data/unequal-slow3-s8.dat' using ($1/1e6):2 with linespoints title 'recipe unequal (17 s budget, delayed), provider-3 2x slower, seed 8', 'plot-data/unequal-slow3-s9.dat' using ($1/1e6):2 with linespoints title 'recipe unequal (17 s budget, delayed), provider-3 2x slower, seed 9'
set output 'loss-vs-bytes-unequal.png'
set title 'Eval loss vs bytes communicated (unequal)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/lan-slow3-s7.dat' using 3:2 with linespoints title 'recipe lan, provider-3 2x slower (XLOCO_THROTTLE), seed 7', 'plot-data/unequal-slow3-s7.dat' using 3:2 with linespoints title 'recipe unequal (17 s budget, delayed), provider-3 2x slower, seed 7', 'plot-data/unequal-slow3-s8.dat' using 3:2 with linespoints title 'recipe unequal (17 s budget, delayed), provider-3 2x slower, seed 8', 'plot-data/unequal-slow3-s9.dat' using 3:2 with linespoints title 'recipe unequal (17 s budget, delayed), provider-3 2x slower, seed 9'
unset logscale x
set output 'loss-vs-tokens-gcide.png'
set title 'Eval loss vs tokens (gcide, plan recipes)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/lan-gcide-s7.dat' using ($1/1e6):2 with linespoints title 'recipe lan on GCIDE (xloco prepare, vocabulary 4096), seed 7', 'plot-data/wan-sparse-gcide-s7.dat' using ($1/1e6):2 with linespoints title 'recipe wan-sparse on GCIDE (xloco prepare, vocabulary 4096), seed 7'
set output 'loss-vs-bytes-gcide.png'
set title 'Eval loss vs bytes communicated (gcide)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/lan-gcide-s7.dat' using 3:2 with linespoints title 'recipe lan on GCIDE (xloco prepare, vocabulary 4096), seed 7', 'plot-data/wan-sparse-gcide-s7.dat' using 3:2 with linespoints title 'recipe wan-sparse on GCIDE (xloco prepare, vocabulary 4096), seed 7'
unset logscale x
set output 'utilization-vs-bandwidth.png'
set title 'Least busy provider vs link bandwidth'
set xlabel 'per-provider link rate, Mbit/s (log)'
set logscale x
set ylabel 'inner compute / (compute + waiting) (%)'
set yrange [*:100.5]
set key bottom right
plot 'plot-data/utilization-0.dat' using 1:2 with linespoints lw 2 pt 7 title 'recipe lan over 5 Mbit/s links, seed 7', 'plot-data/utilization-1.dat' using 1:2 with linespoints lw 2 pt 7 title 'recipe wan over 5 Mbit/s links, seed 7', 'plot-data/utilization-2.dat' using 1:2 with linespoints lw 2 pt 7 title 'recipe wan over 5 Mbit/s links, seed 8', 'plot-data/utilization-3.dat' using 1:2 with linespoints lw 2 pt 7 title 'recipe wan over 5 Mbit/s links, seed 9', 'plot-data/utilization-4.dat' using 1:2 with linespoints lw 2 pt 7 title 'recipe wan-sparse over 5 Mbit/s links, seed 7', 'plot-data/utilization-5.dat' using 1:2 with linespoints lw 2 pt 7 title 'recipe wan-sparse with outer.overlap delayed, fold on arrival, 5 Mbit/s links, seed 7', 97 dt 2 lc rgb 'red' title '97 %'
