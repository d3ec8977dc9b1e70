set terminal pngcairo size 1500,750 font 'sans,9'
set output 'dynamics.png'
set multiplot layout 2,3 title 'Dynamics over training (readings group; mean over seeds, on the first validation windows)'
set grid
set xlabel 'training tokens'
set format x '%.1s%c'
set title 'layer 0: relative displacement of q'
set key off
plot 'dynamics.tsv' index 0 using 1:2 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4' title 'readings/leapfrog', \
     'dynamics.tsv' index 1 using 1:2 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728' title 'readings/drift', \
     'dynamics.tsv' index 2 using 1:2 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#2ca02c' title 'readings/newton-euler', \
     'dynamics.tsv' index 3 using 1:2 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#9467bd' title 'readings/newton-leapfrog', \
     'dynamics.tsv' index 4 using 1:2 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#ff7f0e' title 'readings/unit-leapfrog', \
     'dynamics.tsv' index 5 using 1:2 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#8c564b' title 'readings/uncoupled'
set title 'layer 0: relative displacement of k (3c: force impulse over k)'
set key off
plot 'dynamics.tsv' index 0 using 1:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4' title 'readings/leapfrog', \
     'dynamics.tsv' index 1 using 1:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728' title 'readings/drift', \
     'dynamics.tsv' index 2 using 1:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#2ca02c' title 'readings/newton-euler', \
     'dynamics.tsv' index 3 using 1:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#9467bd' title 'readings/newton-leapfrog', \
     'dynamics.tsv' index 4 using 1:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#ff7f0e' title 'readings/unit-leapfrog', \
     'dynamics.tsv' index 5 using 1:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#8c564b' title 'readings/uncoupled'
set title 'layer 0: tau (mean over heads)'
set key outside right top
plot 'dynamics.tsv' index 0 using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4' title 'readings/leapfrog', \
     'dynamics.tsv' index 1 using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728' title 'readings/drift', \
     'dynamics.tsv' index 2 using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#2ca02c' title 'readings/newton-euler', \
     'dynamics.tsv' index 3 using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#9467bd' title 'readings/newton-leapfrog', \
     'dynamics.tsv' index 4 using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#ff7f0e' title 'readings/unit-leapfrog', \
     'dynamics.tsv' index 5 using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#8c564b' title 'readings/uncoupled'
set title 'layer 1: relative displacement of q'
set key off
plot 'dynamics.tsv' index 0 using 1:5 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4' title 'readings/leapfrog', \
     'dynamics.tsv' index 1 using 1:5 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728' title 'readings/drift', \
     'dynamics.tsv' index 2 using 1:5 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#2ca02c' title 'readings/newton-euler', \
     'dynamics.tsv' index 3 using 1:5 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#9467bd' title 'readings/newton-leapfrog', \
     'dynamics.tsv' index 4 using 1:5 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#ff7f0e' title 'readings/unit-leapfrog', \
     'dynamics.tsv' index 5 using 1:5 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#8c564b' title 'readings/uncoupled'
set title 'layer 1: relative displacement of k (3c: force impulse over k)'
set key off
plot 'dynamics.tsv' index 0 using 1:6 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4' title 'readings/leapfrog', \
     'dynamics.tsv' index 1 using 1:6 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728' title 'readings/drift', \
     'dynamics.tsv' index 2 using 1:6 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#2ca02c' title 'readings/newton-euler', \
     'dynamics.tsv' index 3 using 1:6 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#9467bd' title 'readings/newton-leapfrog', \
     'dynamics.tsv' index 4 using 1:6 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#ff7f0e' title 'readings/unit-leapfrog', \
     'dynamics.tsv' index 5 using 1:6 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#8c564b' title 'readings/uncoupled'
set title 'layer 1: tau (mean over heads)'
set key off
plot 'dynamics.tsv' index 0 using 1:7 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4' title 'readings/leapfrog', \
     'dynamics.tsv' index 1 using 1:7 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728' title 'readings/drift', \
     'dynamics.tsv' index 2 using 1:7 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#2ca02c' title 'readings/newton-euler', \
     'dynamics.tsv' index 3 using 1:7 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#9467bd' title 'readings/newton-leapfrog', \
     'dynamics.tsv' index 4 using 1:7 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#ff7f0e' title 'readings/unit-leapfrog', \
     'dynamics.tsv' index 5 using 1:7 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#8c564b' title 'readings/uncoupled'
unset multiplot
