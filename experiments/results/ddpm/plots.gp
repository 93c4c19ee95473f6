set terminal pngcairo size 900,600 font 'sans,10'
set grid
set key top right
set output 'loss-vs-tokens-fmnist-classifier.png'
set title 'Eval loss vs tokens (fmnist-classifier, plan ddpm)'
set xlabel 'images (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/classifier.dat' using ($1/1e6):2 with linespoints title 'Fashion-MNIST cnn (the scorer)' lw 3 lc rgb 'black'
set output 'loss-vs-tokens-fmnist-ddpm.png'
set title 'Eval loss vs tokens (fmnist-ddpm, plan ddpm)'
set xlabel 'images (millions)'
set ylabel 'eval loss'
unset logscale x
plot 'plot-data/baseline-dp.dat' using ($1/1e6):2 with linespoints title 'one cluster, batch 128' lw 3 lc rgb 'black', 'plot-data/k4-h50-int8.dat' using ($1/1e6):2 with linespoints title 'DiLoCo K=4 H=50 int8'
set output 'loss-vs-bytes-fmnist-ddpm.png'
set title 'Eval loss vs bytes communicated (fmnist-ddpm)'
set xlabel 'bytes sent, up + down, all providers (log)'
set logscale x
plot 'plot-data/baseline-dp.dat' using 3:2 with linespoints title 'one cluster, batch 128' lw 3 lc rgb 'black', 'plot-data/k4-h50-int8.dat' using 3:2 with linespoints title 'DiLoCo K=4 H=50 int8'
unset logscale x
