set terminal pngcairo size 900,560 font 'sans,10'
set output 'claim-5.png'
set title 'Claim 5: validation perplexity (mean; band: min-max over seeds)'
set xlabel 'training tokens'
set ylabel 'validation perplexity (log scale)'
set logscale y
set grid
set key outside right top
set format x '%.1s%c'
set style fill transparent solid 0.18 noborder
plot 'claim-5.tsv' index 0 using 1:3:4 with filledcurves lc rgb '#1f77b4' notitle, \
     'claim-5.tsv' index 0 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#1f77b4' title 'size-10m/leapfrog (3 seeds)', \
     'claim-5.tsv' index 1 using 1:3:4 with filledcurves lc rgb '#d62728' notitle, \
     'claim-5.tsv' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#d62728' title 'size-10m/standard (3 seeds)', \
     'claim-5.tsv' index 2 using 1:3:4 with filledcurves lc rgb '#2ca02c' notitle, \
     'claim-5.tsv' index 2 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#2ca02c' title 'readings/leapfrog (5 seeds)', \
     'claim-5.tsv' index 3 using 1:3:4 with filledcurves lc rgb '#9467bd' notitle, \
     'claim-5.tsv' index 3 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#9467bd' title 'readings/standard (5 seeds)'
