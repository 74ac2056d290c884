#!/usr/bin/env bash
# The main job on the built-in default: sets everything up, writes a synthetic target/draft pair
# (a stories15M-shaped target and its 2-layer early-exit draft) under .specd/models, and generates.
# Extra arguments go to `specd generate` (e.g. --temperature 0.8 --max-tokens 100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SPECD="${SPECD_BUILD_DIR:-build}/tools/specd"
MODELS=.specd/models
if [[ ! -f "$MODELS/target/config.json" ]]; then
  "$SPECD" synth --shape stories15M --residual-scale 0.1 --seed 1 --out "$MODELS/target"
  "$SPECD" synth --early-exit-of "$MODELS/target" --layers 2 --out "$MODELS/draft"
fi
"$SPECD" generate --model "$MODELS/target" --prompt "Once upon a time" --max-tokens 64 "$@"
