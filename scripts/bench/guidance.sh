#!/usr/bin/env bash
# The classifier-free guidance benchmark behind docs/benchmarks.md, on a synthetic $SHAPE target
# with its $DRAFT_LAYERS-layer early-exit draft: one `specd serve`, and `specd bench --compare
# --guidance-scale` at 1 and at 8 streams. Each bench run alternates, in every repeat, the arms
# K=0, K=0 cfg, K=$K, K=$K cfg (the draft unguided) and K=$K cfg+draft (the draft guided too), so
# the report sets guided against unguided tokens/s at the same K, and the acceptance of an
# unguided against a guided draft, side by side. Greedy requests at $STREAMS streams
# ($OUT/streams{1,8}.json), then sampled ones (temperature 1) at $SAMPLED_STREAMS
# ($OUT/streams1_t1.json): a greedy draft is accepted on its argmax alone, which guidance of a
# shallow draft may not move, while a sampled one is judged on its whole distribution.
#
# usage: scripts/bench/guidance.sh          (environment variables below override the defaults)
#   QUICK=1 scripts/bench/guidance.sh      (tiny shape, short runs: checks the pipeline)
set -euo pipefail
cd "$(dirname "$0")/../.."

SPECD="${SPECD:-${SPECD_BUILD_DIR:-build}/tools/specd}"
OUT="${OUT:-bench-out/guidance}"
if [[ "${QUICK:-0}" == 1 ]]; then
  SHAPE="${SHAPE:-tiny}" MAX_TOKENS="${MAX_TOKENS:-16}" REPEATS="${REPEATS:-1}"
fi
SHAPE="${SHAPE:-stories110M}"
DRAFT_LAYERS="${DRAFT_LAYERS:-2}"
THREADS="${THREADS:-2}"          # CPU threads per worker
K="${K:-4}"
SCALE="${SCALE:-1.5}"            # guidance.scale of the guided arms
UNCONDITIONAL="${UNCONDITIONAL:-}"  # the unconditional prompt; empty: BOS
MAX_TOKENS="${MAX_TOKENS:-64}"
REPEATS="${REPEATS:-2}"
STREAMS="${STREAMS-1 8}"
SAMPLED_STREAMS="${SAMPLED_STREAMS-1}"

[[ -x "$SPECD" ]] || { echo "guidance: no specd at $SPECD (build it, or set SPECD)" >&2; exit 1; }
mkdir -p "$OUT"
BENCH_NAME=guidance
source scripts/bench/lib.sh
MODEL="$OUT/models/$SHAPE"
synth_once "$MODEL" "$SHAPE" 0.1
serve --target "$MODEL" --draft-exit-layer "$DRAFT_LAYERS" --threads "$THREADS" \
  --kv-tokens 32768 --max-running 32 --default-k "$K"

for streams in $STREAMS; do
  echo "guidance: $streams stream(s)" >&2
  "$SPECD" bench --server "$address" --compare --k "$K" --streams "$streams" \
    --max-tokens "$MAX_TOKENS" --repeats "$REPEATS" --seed 1 --quiet \
    --guidance-scale "$SCALE" --unconditional "$UNCONDITIONAL" \
    --json "$OUT/streams$streams.json"
done
for streams in $SAMPLED_STREAMS; do
  echo "guidance: $streams stream(s), temperature 1" >&2
  "$SPECD" bench --server "$address" --compare --k "$K" --streams "$streams" \
    --max-tokens "$MAX_TOKENS" --repeats "$REPEATS" --seed 1 --quiet --temperature 1 \
    --guidance-scale "$SCALE" --unconditional "$UNCONDITIONAL" \
    --json "$OUT/streams${streams}_t1.json"
done
