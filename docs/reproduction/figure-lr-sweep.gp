set terminal pngcairo size 1440,720 font 'sans,9'
set output 'figure-lr-sweep.png'
set multiplot layout 2,3 title 'Final valid ppl against the peak learning rate (2 seeds) (mean, 95% CI)'
set grid
set key off
set logscale x
set xlabel 'lr'
set ylabel 'final valid ppl'
set xrange [0.000333333:0.012]
set offsets 0, 0, graph 0.05, graph 0.05
set title 'standard'
unset arrow 1
plot 'figure-lr-sweep-0.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#1f77b4' notitle
set title 'diff'
unset arrow 1
plot 'figure-lr-sweep-1.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#d62728' notitle
set title 'leapfrog'
unset arrow 1
plot 'figure-lr-sweep-2.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#2ca02c' notitle
set title 'best-3c'
unset arrow 1
plot 'figure-lr-sweep-3.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#9467bd' notitle
set title 'affine'
unset arrow 1
plot 'figure-lr-sweep-4.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#ff7f0e' notitle
unset multiplot
