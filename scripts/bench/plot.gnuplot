# The sweep's figures, from the tables of scripts/bench/tables.py:
#   gnuplot -e "dir='bench-out'" scripts/bench/plot.gnuplot
# speedup_vs_k.png: measured, engine-limited and ideal speed-up against K, one colour per α;
# tokens_vs_concurrency.png and speedup_vs_concurrency.png: K=0 against K=4 (fixed, adaptive).
if (!exists("dir")) dir = "bench-out"
set terminal pngcairo size 900,600 font ",11"
set grid
set key top left

ksweep = dir."/k_sweep.tsv"
stats ksweep using 3 nooutput
blocks = STATS_blocks
alphas = system("awk 'NF && !/^#/ {print $1}' ".ksweep." | uniq")
set output dir."/speedup_vs_k.png"
set title "Speculative decoding speed-up over K=0 (one stream)"
set xlabel "K (draft tokens per round)"
set ylabel "speed-up"
set xrange [0:*]
plot for [i=0:blocks-1] ksweep index i using 3:4 with linespoints lw 2 pt 7 lc i+1 \
       title sprintf("measured, α≈%s", word(alphas, i+1)), \
     for [i=0:blocks-1] ksweep index i using 3:6 with lines dt 2 lw 1.5 lc i+1 notitle, \
     for [i=0:blocks-1] ksweep index i using 3:5 with lines dt 3 lw 1 lc i+1 notitle, \
     1 with lines lc rgb "gray" dt 4 title "no gain", \
     NaN with lines dt 2 lc rgb "black" title "engine-limited prediction", \
     NaN with lines dt 3 lc rgb "black" title "ideal (Leviathan et al.)"

conc = dir."/concurrency.tsv"
# A sweep run with STREAMS= has no concurrency data: plot only what there is.
have_conc = int(system("awk 'NF && !/^#/' ".conc." | wc -l")) > 0
if (have_conc) {
  set output dir."/tokens_vs_concurrency.png"
  set title "Output tokens/s against concurrent streams"
  set xlabel "concurrent streams"
  set ylabel "output tokens/s (median over repeats)"
  set logscale x 2
  set xrange [*:*]
  plot conc using 1:2 with linespoints lw 2 pt 7 title "K=0", \
       conc using 1:3 with linespoints lw 2 pt 5 title "K=4 fixed", \
       conc using 1:5 with linespoints lw 2 pt 9 title "K=4 adaptive"

  set output dir."/speedup_vs_concurrency.png"
  set title "Speed-up of K=4 over K=0 against concurrent streams"
  set ylabel "speed-up"
  plot conc using 1:4 with linespoints lw 2 pt 5 title "K=4 fixed", \
       conc using 1:6 with linespoints lw 2 pt 9 title "K=4 adaptive", \
       1 with lines lc rgb "gray" dt 4 title "no gain", \
       0.95 with lines lc rgb "red" dt 3 title "-5%"
}
