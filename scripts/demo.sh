#!/usr/bin/env bash
# The main job on the built-in default: sets everything up, writes a synthetic target/draft pair
# (a stories15M-shaped target and its 2-layer early-exit draft) under .specd/models, starts
# `specd serve` (target worker, draft worker, coordinator) on loopback, streams one generation
# through the public API, and stops the server. Extra arguments go to `specd generate`
# (e.g. --temperature 0.8 --k 6).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs, so a newcomer sees text before the test suite is compiled.
SPECD_TARGETS="specd specd-coordinator specd_draft_worker specd_target_worker" bash scripts/setup.sh
SPECD="${SPECD_BUILD_DIR:-build}/tools/specd"
MODELS=.specd/models
if [[ ! -f "$MODELS/target/config.json" ]]; then
  "$SPECD" synth --shape stories15M --residual-scale 0.1 --seed 1 --out "$MODELS/target"
  "$SPECD" synth --early-exit-of "$MODELS/target" --layers 2 --out "$MODELS/draft"
fi

log=$(mktemp)
"$SPECD" serve --target "$MODELS/target" --draft "$MODELS/draft" --listen 127.0.0.1:0 \
  --kv-tokens 8192 >"$log" &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  grep -q "^listening on" "$log" && break
  kill -0 $server 2>/dev/null || { echo "specd serve failed to start" >&2; exit 1; }
  sleep 0.1
done
address=$(sed -n 's/^listening on //p' "$log")
echo "[demo] specd serving on $address" >&2
"$SPECD" generate --server "$address" --prompt "Once upon a time" --max-tokens 64 --k 4 "$@"
