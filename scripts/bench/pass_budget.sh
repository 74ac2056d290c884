#!/usr/bin/env bash
# The per-pass token budget benchmark behind docs/benchmarks.md: $STREAMS streams decode while
# long prompts (new text each, so no prefix cache helps) arrive $BURST at a time, on a synthetic
# $SHAPE target with its $DRAFT_LAYERS-layer early-exit draft. Two `specd serve` side by side,
# alternating within each repeat, both chunking prompts at --prefill-chunk $CHUNK:
#   a: the workers' --max-pass-tokens $BUDGET;
#   b: a budget no round reaches (16777216): the burst's chunks meet in one pass.
# The streams' ITL p99 is the stall that pass causes; the long prompts' TTFT is what bounding it
# costs them. JSON goes to $OUT.
#
# usage: scripts/bench/pass_budget.sh      (environment variables below override the defaults)
#   QUICK=1 scripts/bench/pass_budget.sh   (tiny shape, short runs: checks the pipeline)
set -euo pipefail
cd "$(dirname "$0")/../.."

SPECD="${SPECD:-${SPECD_BUILD_DIR:-build}/tools/specd}"
OUT="${OUT:-bench-out/pass_budget}"
if [[ "${QUICK:-0}" == 1 ]]; then
  SHAPE="${SHAPE:-tiny}" LONG_TOKENS="${LONG_TOKENS:-200}" STREAM_TOKENS="${STREAM_TOKENS:-48}"
  CHUNK="${CHUNK:-64}" BUDGET="${BUDGET:-256}"
fi
SHAPE="${SHAPE:-stories110M}"
DRAFT_LAYERS="${DRAFT_LAYERS:-2}"
THREADS="${THREADS:-2}"  # CPU threads per worker
K="${K:-4}"
REPEATS="${REPEATS:-1}"
STREAMS="${STREAMS:-8}"
STREAM_TOKENS="${STREAM_TOKENS:-160}"
LONG_TOKENS="${LONG_TOKENS:-800}"
BURST="${BURST:-4}"      # long prompts in flight at once
CHUNK="${CHUNK:-512}"    # both servers' --prefill-chunk (the default)
BUDGET="${BUDGET:-512}"  # server a's --max-pass-tokens

[[ -x "$SPECD" ]] || { echo "pass_budget: no specd at $SPECD (build it, or set SPECD)" >&2; exit 1; }
mkdir -p "$OUT"
BENCH_NAME=pass_budget
source scripts/bench/lib.sh
MODEL="$OUT/models/$SHAPE"
synth_once "$MODEL" "$SHAPE" 0.1

start_server() {
  serve --target "$MODEL" --draft-exit-layer "$DRAFT_LAYERS" --threads "$THREADS" \
    --kv-tokens 32768 --max-running 32 --default-k "$K" --prefill-chunk "$CHUNK" "$@"
}

echo "pass_budget: --max-pass-tokens $BUDGET (a) against 16777216 (b), bursts of $BURST" >&2
start_server --max-pass-tokens "$BUDGET"
start_server --max-pass-tokens 16777216
"$SPECD" bench --scenario long-prompts --server "${addresses[0]}" --baseline "${addresses[1]}" \
  --k "$K" --repeats "$REPEATS" --seed 1 --decode-streams "$STREAMS" \
  --stream-tokens "$STREAM_TOKENS" --long-prompt-tokens "$LONG_TOKENS" --answer-tokens 8 \
  --long-prompt-gap 0 --long-prompt-concurrency "$BURST" \
  --json "$OUT/burst${BURST}_budget${BUDGET}.json"
stop_servers
echo "pass_budget: done; JSON in $OUT" >&2
