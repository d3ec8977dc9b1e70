set terminal pngcairo size 700,480 font 'sans,10'
set output 'steps-steps-newton-leapfrog.png'
set title 'steps/newton-leapfrog: final validation perplexity vs integration steps (mean, 95% CI)'
set xlabel 'steps N'
set ylabel 'validation perplexity'
set grid
set xrange [0:8]
set key off
plot 'steps-steps-newton-leapfrog.tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#1f77b4'
