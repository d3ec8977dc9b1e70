set terminal pngcairo size 480,380 font 'sans,9'
set output 'figure-init-time.png'
set multiplot layout 1,1 title 'Reading 3c, best variant: paired change against standard by initial integration time (mean, 95% CI)'
set grid
set key off
set logscale x
set xlabel 'init-time'
set ylabel 'change of valid ppl vs b (%)'
set xrange [0.166667:3]
set offsets 0, 0, graph 0.05, graph 0.05
set title 'reading 3c, best variant'
set arrow 1 from graph 0, first 0 to graph 1, first 0 nohead lc rgb '#000000'
plot 'figure-init-time-0.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#1f77b4' notitle
unset multiplot
