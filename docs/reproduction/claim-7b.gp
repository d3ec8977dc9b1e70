set terminal pngcairo size 900,560 font 'sans,10'
set output 'claim-7b.png'
set title 'Claim 7b: validation perplexity (mean; band: min-max over seeds)'
set xlabel 'training tokens'
set ylabel 'validation perplexity (log scale)'
set logscale y
set grid
set key outside right top
set format x '%.1s%c'
set style fill transparent solid 0.18 noborder
plot 'claim-7b.tsv' index 0 using 1:3:4 with filledcurves lc rgb '#1f77b4' notitle, \
     'claim-7b.tsv' index 0 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#1f77b4' title 'tuned/affine (3 seeds)', \
     'claim-7b.tsv' index 1 using 1:3:4 with filledcurves lc rgb '#d62728' notitle, \
     'claim-7b.tsv' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '#d62728' title 'tuned/diff (3 seeds)'
