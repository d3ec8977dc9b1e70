set terminal pngcairo size 900,560 font 'sans,10'
set output 'claim-4-s2.png'
set title 'Claim 4-s2: validation perplexity (mean; band: min-max over seeds)'
set xlabel 'training tokens'
set ylabel 'validation perplexity (log scale)'
set logscale y
set grid
set key outside right top
set format x '%.1s%c'
set style fill transparent solid 0.18 noborder
set arrow from graph 0, first 111.744 to graph 1, first 111.744 nohead dt 2 lc rgb '#555555'
set label 'readings/leapfrog final' at graph 0.02, first 113.979
plot 'claim-4-s2.tsv' index 0 using 1:3:4 with filledcurves lc rgb '#1f77b4' notitle, \
     'claim-4-s2.tsv' index 0 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#1f77b4' title 'readings/leapfrog (5 seeds)', \
     'claim-4-s2.tsv' index 1 using 1:3:4 with filledcurves lc rgb '#d62728' notitle, \
     'claim-4-s2.tsv' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#d62728' title 'readings/standard (5 seeds)', \
     'claim-4-s2.tsv' index 2 using 1:3:4 with filledcurves lc rgb '#2ca02c' notitle, \
     'claim-4-s2.tsv' index 2 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#2ca02c' title 'tokens-1.5x/standard (3 seeds)', \
     'claim-4-s2.tsv' index 3 using 1:3:4 with filledcurves lc rgb '#9467bd' notitle, \
     'claim-4-s2.tsv' index 3 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#9467bd' title 'tokens-2x/standard (3 seeds)', \
     'claim-4-s2.tsv' index 4 using 1:3:4 with filledcurves lc rgb '#ff7f0e' notitle, \
     'claim-4-s2.tsv' index 4 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#ff7f0e' title 'tokens-3x/standard (3 seeds)'
