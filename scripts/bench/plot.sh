#!/usr/bin/env bash
# Tables, a printed summary (with the concurrency crossover) and PNGs from the JSON that
# scripts/bench/sweep.sh wrote. Needs gnuplot (Debian: gnuplot-nox).
# usage: scripts/bench/plot.sh [OUT_DIR]   (default: bench-out)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-bench-out}"
/usr/bin/python3 "$here/tables.py" "$out" | tee "$out/summary.txt"
if ! command -v gnuplot >/dev/null; then
  echo "plot: gnuplot is not installed (apt-get install gnuplot-nox)" >&2
  exit 1
fi
gnuplot -e "dir='$out'" "$here/plot.gnuplot"
echo "plot: wrote the PNGs in $out" >&2
