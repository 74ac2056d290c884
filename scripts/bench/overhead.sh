#!/usr/bin/env bash
# Coordinator overhead per round, side by side for one or more builds or serve settings: for each
# arm in turn (repeated ROUNDS times, alternating, so that machine drift hits every arm alike) it
# serves the model with `specd serve` and runs `specd bench --compare --k $K --streams 1`, then
# prints each run's round time, overhead per round and overhead fraction, and efficiency.
#
# usage: scripts/bench/overhead.sh MODEL_DIR ARM [ARM ...]
#   MODEL_DIR   a target checkpoint; its first $DRAFT_LAYERS layers are the draft
#   ARM         BUILD_DIR, a build tree holding tools/specd and the three service binaries,
#               optionally followed by `:` and `specd serve` flags for that arm, e.g.
#               build:--worker-local-sockets=off  (the coordinator on gRPC only)
# environment: K (4), DRAFT_LAYERS (2), THREADS (2 per worker), MAX_TOKENS (128), REPEATS (3),
#   ROUNDS (2), OUT (bench-out/overhead)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $# -lt 2 ]]; then
  echo "usage: $0 MODEL_DIR BUILD_DIR [BUILD_DIR ...]" >&2
  exit 2
fi
model=$1
shift
K=${K:-4} DRAFT_LAYERS=${DRAFT_LAYERS:-2} THREADS=${THREADS:-2} MAX_TOKENS=${MAX_TOKENS:-128}
REPEATS=${REPEATS:-3} ROUNDS=${ROUNDS:-2} OUT=${OUT:-bench-out/overhead}
mkdir -p "$OUT"

BENCH_NAME=overhead
source scripts/bench/lib.sh

run_one() {  # BUILD_DIR JSON_OUT [SERVE_FLAG ...]
  local build=$1 json=$2
  shift 2
  serve_with "$build/tools/specd" --target "$model" --draft-exit-layer "$DRAFT_LAYERS" \
    --threads "$THREADS" --backend cpu "$@"
  "$build/tools/specd" bench --server "$address" --compare --k "$K" --streams 1 \
    --max-tokens "$MAX_TOKENS" --repeats "$REPEATS" --json "$json" >/dev/null
  stop_servers
}

for round in $(seq "$ROUNDS"); do
  for arm in "$@"; do
    build=${arm%%:*}
    flags=()
    [[ $arm == *:* ]] && read -r -a flags <<<"${arm#*:}"
    name=$(basename "$(cd "$build/.." && pwd)")$(printf '%s' "${flags[*]}" | tr -c 'a-z0-9' '_')
    json="$OUT/${name}-r${round}.json"
    echo "[overhead] round $round: $arm" >&2
    run_one "$build" "$json" "${flags[@]}"
    /usr/bin/python3 - "$json" "$arm" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
efficiency = {c["k"]: c["efficiency"] for c in report["compare"]}
for arm in report["arms"]:
    print(f"{sys.argv[2]:32s} K={arm['k']}  round {arm['round_ms']:6.2f} ms  overhead "
          f"{arm['overhead_ms']:5.2f} ms = {100 * arm['overhead_fraction']:4.1f}%"
          + (f"  efficiency {efficiency[arm['k']]:.3f}" if arm["k"] in efficiency else ""))
PY
  done
done
