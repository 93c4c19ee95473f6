set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-attack.png'
set title 'Eval loss vs tokens (attack, plan attack)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/k4-honest.dat' using ($1/1e6):2 with linespoints title 'K=4 int8, no attacker', 'plot-data/k4-scale1000.dat' using ($1/1e6):2 with linespoints title '1 of 4 sends 1000x its delta', 'plot-data/k4-zero.dat' using ($1/1e6):2 with linespoints title '1 of 4 sends zero frames', 'plot-data/k4-negate9.dat' using ($1/1e6):2 with linespoints title '1 of 4 sends -9x its delta (negated, under the bound 10)', 'plot-data/k4-noise9.dat' using ($1/1e6):2 with linespoints title '1 of 4 sends Gaussian noise of 9x its delta''s norm', 'plot-data/k4-ramp2.dat' using ($1/1e6):2 with linespoints title '1 of 4 doubles its delta every round'
set output 'loss-vs-bytes-attack.png'
set title 'Eval loss vs bytes communicated (attack)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/k4-honest.dat' using 3:2 with linespoints title 'K=4 int8, no attacker', 'plot-data/k4-scale1000.dat' using 3:2 with linespoints title '1 of 4 sends 1000x its delta', 'plot-data/k4-zero.dat' using 3:2 with linespoints title '1 of 4 sends zero frames', 'plot-data/k4-negate9.dat' using 3:2 with linespoints title '1 of 4 sends -9x its delta (negated, under the bound 10)', 'plot-data/k4-noise9.dat' using 3:2 with linespoints title '1 of 4 sends Gaussian noise of 9x its delta''s norm', 'plot-data/k4-ramp2.dat' using 3:2 with linespoints title '1 of 4 doubles its delta every round'
unset logscale x
