set terminal pngcairo size 960,380 font 'sans,9'
set output 'figure-scale-ladder.png'
set multiplot layout 1,2 title 'Paired change of valid ppl against standard attention, by model size (mean, 95% CI)'
set grid
set key off
set logscale x
set xlabel 'parameters'
set ylabel 'change of valid ppl vs b (%)'
set xrange [627120:1.57672e+07]
set offsets 0, 0, graph 0.05, graph 0.05
set title 'reading 3c, best variant'
set arrow 1 from graph 0, first 0 to graph 1, first 0 nohead lc rgb '#000000'
plot 'figure-scale-ladder-0.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#1f77b4' notitle
set title 'section 2, leapfrog'
set arrow 1 from graph 0, first 0 to graph 1, first 0 nohead lc rgb '#000000'
plot 'figure-scale-ladder-1.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#d62728' notitle
unset multiplot
