#!/usr/bin/env bash
# The speculative-decoding sweep behind docs/benchmarks.md, on synthetic target/draft pairs:
#   1. for each target acceptance α in $ALPHAS, finds by bisection the residual scale s of a
#      `specd synth --shape $SHAPE` target whose $DRAFT_LAYERS-layer early-exit draft is accepted
#      at that α (short `specd bench --k 4` runs; α as `specd bench` defines it);
#   2. on each calibrated pair, `specd bench --compare --k $KS` on one stream (speed-up vs K);
#   3. on the pair nearest α = $CONCURRENCY_ALPHA, `specd bench --compare --k 4` at each
#      concurrency in $STREAMS, with a fixed K and with the server's adaptive K (tokens/s vs
#      concurrency, and where speculation stops paying).
# Every run writes its JSON under $OUT; scripts/bench/plot.sh turns them into tables and PNGs.
#
# usage: scripts/bench/sweep.sh            (environment variables below override the defaults)
#   QUICK=1 scripts/bench/sweep.sh        (tiny model, short runs: checks the pipeline in ~2 min)
set -euo pipefail
cd "$(dirname "$0")/../.."

SPECD="${SPECD:-${SPECD_BUILD_DIR:-build}/tools/specd}"
OUT="${OUT:-bench-out}"
MODELS="${MODELS:-$OUT/models}"
if [[ "${QUICK:-0}" == 1 ]]; then
  SHAPE="${SHAPE:-tiny}" MAX_TOKENS="${MAX_TOKENS:-32}" REPEATS="${REPEATS:-1}"
  ALPHAS="${ALPHAS:-0.5 0.8}" STREAMS="${STREAMS-1 4}" KS="${KS:-1,2,4}"
  CONCURRENCY_ALPHA="${CONCURRENCY_ALPHA:-0.8}" BISECT_STEPS="${BISECT_STEPS:-4}"
fi
SHAPE="${SHAPE:-stories110M}"           # stories15M, stories42M, stories110M, ...
DRAFT_LAYERS="${DRAFT_LAYERS:-2}"       # layers of the early-exit draft
THREADS="${THREADS:-2}"                 # CPU threads per worker
MAX_TOKENS="${MAX_TOKENS:-128}"
REPEATS="${REPEATS:-3}"
ALPHAS="${ALPHAS:-0.3 0.5 0.7 0.9}"
KS="${KS:-1,2,4,6,8}"
STREAMS="${STREAMS-1 2 4 8 16}"
CONCURRENCY_ALPHA="${CONCURRENCY_ALPHA:-0.7}"   # STREAMS="" skips the concurrency sweep
REQUESTS_PER_STREAM="${REQUESTS_PER_STREAM:-2}"  # concurrency sweep: requests per arm and repeat
BISECT_STEPS="${BISECT_STEPS:-7}"       # halvings of log(s) per α
ALPHA_TOLERANCE="${ALPHA_TOLERANCE:-0.03}"
S_LOW="${S_LOW:-0.005}" S_HIGH="${S_HIGH:-2.0}"  # α falls as s grows
PY=/usr/bin/python3

[[ -x "$SPECD" ]] || { echo "sweep: no specd at $SPECD (build it, or set SPECD)" >&2; exit 1; }
mkdir -p "$OUT" "$MODELS"

BENCH_NAME=sweep
source scripts/bench/lib.sh

# start_server TARGET_DIR: serves TARGET alone, with its first $DRAFT_LAYERS layers as the draft,
# and sets $address.
start_server() {
  stop_servers
  serve --target "$1" --draft-exit-layer "$DRAFT_LAYERS" --threads "$THREADS" --kv-tokens 16384 \
    --max-running 32
}

# model_for S: the target with residual scale S, written once.
model_for() {
  local dir="$MODELS/$SHAPE-s$1"
  synth_once "$dir" "$SHAPE" "$1"
  echo "$dir"
}

json_get() {  # json_get FILE PYTHON_EXPRESSION_OVER_j
  "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# measure_alpha S: sets $measured_alpha, the α of the draft at residual scale S, from a short
# single-stream K = 4 run (kept in $OUT/calibrate, so a scale is measured once). Functions that
# start servers set variables instead of printing: a $(...) subshell would orphan its server.
measure_alpha() {
  local json="$OUT/calibrate/$SHAPE-d$DRAFT_LAYERS-s$1.json"
  mkdir -p "$OUT/calibrate"
  if [[ ! -f "$json" ]]; then
    start_server "$(model_for "$1")"
    "$SPECD" bench --server "$address" --k 4 --streams 1 --requests 4 --max-tokens 64 \
      --warmup 1 --quiet --json "$json.tmp" >/dev/null
    mv "$json.tmp" "$json"
  fi
  measured_alpha=$(json_get "$json" 'j["arms"][0]["alpha"]')
}

# calibrate TARGET_ALPHA: bisection over log(s); sets $calibrated_scale to the best s found.
calibrate() {
  local want=$1 lo=$S_LOW hi=$S_HIGH best="" best_err=9 s err
  for _ in $(seq 1 "$BISECT_STEPS"); do
    s=$("$PY" -c "import math; print('%.4g' % math.sqrt($lo * $hi))")
    measure_alpha "$s"
    err=$("$PY" -c "print(abs($measured_alpha - $want))")
    echo "sweep: calibrate alpha=$want: s=$s gives alpha=$measured_alpha" >&2
    if "$PY" -c "import sys; sys.exit(0 if $err < $best_err else 1)"; then best=$s best_err=$err; fi
    "$PY" -c "import sys; sys.exit(0 if $err < $ALPHA_TOLERANCE else 1)" && break
    # α too high: more residual (larger s); too low: less.
    if "$PY" -c "import sys; sys.exit(0 if $measured_alpha > $want else 1)"; then
      lo=$s
    else
      hi=$s
    fi
  done
  calibrated_scale=$best
}

declare -A scale_of
: >"$OUT/calibration.tsv"
for alpha in $ALPHAS ${STREAMS:+$CONCURRENCY_ALPHA}; do
  [[ -n "${scale_of[$alpha]:-}" ]] && continue
  calibrate "$alpha"
  scale_of[$alpha]=$calibrated_scale
  echo -e "$alpha\t${scale_of[$alpha]}" >>"$OUT/calibration.tsv"
done

common=(--max-tokens "$MAX_TOKENS" --repeats "$REPEATS" --quiet)
for alpha in $ALPHAS; do
  start_server "$(model_for "${scale_of[$alpha]}")"
  echo "sweep: alpha~$alpha (s=${scale_of[$alpha]}): K in {$KS}, one stream" >&2
  "$SPECD" bench --server "$address" --compare --k "$KS" --streams 1 "${common[@]}" \
    --json "$OUT/k_sweep_alpha$alpha.json"
done

[[ -n "$STREAMS" ]] && start_server "$(model_for "${scale_of[$CONCURRENCY_ALPHA]}")"
for streams in $STREAMS; do
  for policy in fixed adaptive; do
    echo "sweep: alpha~$CONCURRENCY_ALPHA, $streams stream(s), K=4 $policy" >&2
    extra=()
    [[ $policy == adaptive ]] && extra=(--adaptive)
    "$SPECD" bench --server "$address" --compare --k 4 --streams "$streams" "${common[@]}" \
      --requests $((streams * REQUESTS_PER_STREAM)) "${extra[@]}" \
      --json "$OUT/concurrency_${policy}_streams$streams.json"
  done
done
stop_servers
echo "sweep: done; JSON in $OUT. Plot with: scripts/bench/plot.sh $OUT" >&2
