#!/usr/bin/env bash
# How much other clients' prompt tokenization stalls a running stream, side by side for one or
# more builds: for each build in turn (ROUNDS times, alternating, so that machine drift hits
# every build alike) it serves the model with `specd serve --http-listen` and runs
# scripts/bench/prep_stall.py, which streams a greedy completion alone and then while FLOODERS
# clients post /tokenize requests of PROMPT_BYTES of text; prints each run's event gaps.
#
# usage: scripts/bench/prep_stall.sh MODEL_DIR BUILD_DIR [BUILD_DIR ...]
#   MODEL_DIR   a target checkpoint with a tokenizer; its first layer is the draft
#   BUILD_DIR   a build tree holding tools/specd and the three service binaries (or a folder
#               tools/specd/ holding the four side by side)
# environment: FLOODERS (4), PROMPT_BYTES (1000000), MAX_TOKENS (200), ROUNDS (2),
#   OUT (bench-out/prep_stall)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $# -lt 2 ]]; then
  echo "usage: $0 MODEL_DIR BUILD_DIR [BUILD_DIR ...]" >&2
  exit 2
fi
model=$1
shift
FLOODERS=${FLOODERS:-4} PROMPT_BYTES=${PROMPT_BYTES:-1000000} MAX_TOKENS=${MAX_TOKENS:-200}
ROUNDS=${ROUNDS:-2} OUT=${OUT:-bench-out/prep_stall}
mkdir -p "$OUT"

BENCH_NAME=prep_stall
source scripts/bench/lib.sh

specd_of() {  # BUILD_DIR: its specd binary
  if [[ -d "$1/tools/specd" ]]; then echo "$1/tools/specd/specd"; else echo "$1/tools/specd"; fi
}

for round in $(seq "$ROUNDS"); do
  for build in "$@"; do
    name=$(basename "$build")
    echo "[prep_stall] round $round: $build" >&2
    serve_with "$(specd_of "$build")" --target "$model" --draft-exit-layer 1 --threads 1 \
      --backend cpu --http-listen 127.0.0.1:0
    http=$(sed -n 's/^http on //p' "${bench_logs[-1]}")
    echo "== $name, round $round"
    python3 scripts/bench/prep_stall.py "$http" --flooders "$FLOODERS" \
      --prompt-bytes "$PROMPT_BYTES" --max-tokens "$MAX_TOKENS" | tee "$OUT/$name-r$round.txt" |
      head -2
    stop_servers
  done
done
