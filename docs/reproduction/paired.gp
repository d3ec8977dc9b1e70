set terminal pngcairo size 900,520 font 'sans,10'
set output 'docs/reproduction/paired.png'
set title 'Paired validation-perplexity change per seed (a vs b, %), mean and 95% CI'
set ylabel 'change of a vs b (%), negative: a is better'
set xlabel 'claim'
set grid ytics
set xrange [0.5:12.5]
set xtics ("1" 1, "1b" 2, "2a" 3, "2b" 4, "3a" 5, "3b" 6, "6b" 7, "7a" 8, "7b" 9, "7c" 10, "I1" 11, "I2" 12)
set key top left
set arrow from graph 0, first 0 to graph 1, first 0 nohead lc rgb '#000000'
plot 'docs/reproduction/paired.tsv' index 0 using ($1-0.12):4 with points pt 7 ps 0.8 lc rgb '#1f77b4' title 'seed', \
     'docs/reproduction/paired.tsv' index 1 using ($1+0.12):2:3:4 with yerrorbars pt 5 ps 1 lw 2 lc rgb '#d62728' title 'mean, 95% CI'
