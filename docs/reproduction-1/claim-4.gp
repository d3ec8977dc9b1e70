set terminal pngcairo size 900,560 font 'sans,10'
set output 'claim-4.png'
set title 'Claim 4: validation perplexity (mean; band: min-max over seeds)'
set xlabel 'training tokens'
set ylabel 'validation perplexity (log scale)'
set logscale y
set grid
set key outside right top
set format x '%.1s%c'
set style fill transparent solid 0.18 noborder
set arrow from graph 0, first 111.744 to graph 1, first 111.744 nohead dt 2 lc rgb '#555555'
set label 'sotu/leapfrog final' at graph 0.02, first 113.979
plot 'claim-4.tsv' index 0 using 1:3:4 with filledcurves lc rgb '#1f77b4' notitle, \
     'claim-4.tsv' index 0 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#1f77b4' title 'sotu/leapfrog (5 seeds)', \
     'claim-4.tsv' index 1 using 1:3:4 with filledcurves lc rgb '#d62728' notitle, \
     'claim-4.tsv' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#d62728' title 'long/standard (3 seeds)'
