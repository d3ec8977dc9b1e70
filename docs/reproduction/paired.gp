set terminal pngcairo size 1300,740 font 'sans,8'
set output 'paired.png'
set multiplot layout 3,5 title 'Paired valid-ppl change of a vs b per seed (%; negative: a is better): seeds (dots), mean and 95% CI (bar at 0); each panel its own scale'
set grid ytics
set key off
set xrange [-0.8:*]
set xtics ('mean' 0)
set offsets 0, 0.6, graph 0.1, graph 0.1
set title 'claim 1'
plot 'paired.tsv' index 0 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 1 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 1-3c'
plot 'paired.tsv' index 2 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 3 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 1b-3c'
plot 'paired.tsv' index 4 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 5 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 1c-3c'
plot 'paired.tsv' index 6 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 7 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim D1'
plot 'paired.tsv' index 8 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 9 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim D2'
plot 'paired.tsv' index 10 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 11 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim D3'
plot 'paired.tsv' index 12 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 13 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim D4'
plot 'paired.tsv' index 14 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 15 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 2a-3c'
plot 'paired.tsv' index 16 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 17 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 2a2-3c'
plot 'paired.tsv' index 18 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 19 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 2b'
plot 'paired.tsv' index 20 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 21 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
set title 'claim 2b-3c'
plot 'paired.tsv' index 22 using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', 'paired.tsv' index 23 using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'
unset multiplot
