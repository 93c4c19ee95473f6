set terminal pngcairo noenhanced size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-demo.png'
set title 'Eval loss vs tokens (demo, plan honest-cost)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/demo-s4-noclip.dat' using ($1/1e6):2 with linespoints title 'demo, seed 4, outer.norm_clip off', 'plot-data/demo-s4-clip.dat' using ($1/1e6):2 with linespoints title 'demo, seed 4, outer.norm_clip on', 'plot-data/demo-s5-noclip.dat' using ($1/1e6):2 with linespoints title 'demo, seed 5, outer.norm_clip off', 'plot-data/demo-s5-clip.dat' using ($1/1e6):2 with linespoints title 'demo, seed 5, outer.norm_clip on', 'plot-data/demo-s6-noclip.dat' using ($1/1e6):2 with linespoints title 'demo, seed 6, outer.norm_clip off', 'plot-data/demo-s6-clip.dat' using ($1/1e6):2 with linespoints title 'demo, seed 6, outer.norm_clip on'
set output 'loss-vs-bytes-demo.png'
set title 'Eval loss vs bytes communicated (demo)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/demo-s4-noclip.dat' using 3:2 with linespoints title 'demo, seed 4, outer.norm_clip off', 'plot-data/demo-s4-clip.dat' using 3:2 with linespoints title 'demo, seed 4, outer.norm_clip on', 'plot-data/demo-s5-noclip.dat' using 3:2 with linespoints title 'demo, seed 5, outer.norm_clip off', 'plot-data/demo-s5-clip.dat' using 3:2 with linespoints title 'demo, seed 5, outer.norm_clip on', 'plot-data/demo-s6-noclip.dat' using 3:2 with linespoints title 'demo, seed 6, outer.norm_clip off', 'plot-data/demo-s6-clip.dat' using 3:2 with linespoints title 'demo, seed 6, outer.norm_clip on'
unset logscale x
set output 'loss-vs-tokens-sparse.png'
set title 'Eval loss vs tokens (sparse, plan honest-cost)'
set xlabel 'tokens (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/sparse-s4-noclip.dat' using ($1/1e6):2 with linespoints title 'sparse, seed 4, outer.norm_clip off', 'plot-data/sparse-s4-clip.dat' using ($1/1e6):2 with linespoints title 'sparse, seed 4, outer.norm_clip on', 'plot-data/sparse-s5-noclip.dat' using ($1/1e6):2 with linespoints title 'sparse, seed 5, outer.norm_clip off', 'plot-data/sparse-s5-clip.dat' using ($1/1e6):2 with linespoints title 'sparse, seed 5, outer.norm_clip on', 'plot-data/sparse-s6-noclip.dat' using ($1/1e6):2 with linespoints title 'sparse, seed 6, outer.norm_clip off', 'plot-data/sparse-s6-clip.dat' using ($1/1e6):2 with linespoints title 'sparse, seed 6, outer.norm_clip on'
set output 'loss-vs-bytes-sparse.png'
set title 'Eval loss vs bytes communicated (sparse)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/sparse-s4-noclip.dat' using 3:2 with linespoints title 'sparse, seed 4, outer.norm_clip off', 'plot-data/sparse-s4-clip.dat' using 3:2 with linespoints title 'sparse, seed 4, outer.norm_clip on', 'plot-data/sparse-s5-noclip.dat' using 3:2 with linespoints title 'sparse, seed 5, outer.norm_clip off', 'plot-data/sparse-s5-clip.dat' using 3:2 with linespoints title 'sparse, seed 5, outer.norm_clip on', 'plot-data/sparse-s6-noclip.dat' using 3:2 with linespoints title 'sparse, seed 6, outer.norm_clip off', 'plot-data/sparse-s6-clip.dat' using 3:2 with linespoints title 'sparse, seed 6, outer.norm_clip on'
unset logscale x
