set terminal pngcairo size 480,380 font 'sans,9'
set output 'figure-budget.png'
set multiplot layout 1,1 title 'Standard attention: final valid ppl against the token budget (each its own schedule) (mean, 95% CI)'
set grid
set key off
set logscale x
set xlabel 'tokens'
set ylabel 'final valid ppl'
set xrange [1.3981e+06:9.43718e+06]
set offsets 0, 0, graph 0.05, graph 0.05
set title 'standard'
unset arrow 1
plot 'figure-budget-0.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#1f77b4' notitle
unset multiplot
