#!/usr/bin/env bash
# Sets everything up and runs the whole test suite. Tests that need the project's shared golden
# data read it from SPECD_SHARED_DIR (default: ../shared beside this checkout, when present).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ -z "${SPECD_SHARED_DIR:-}" && -d ../shared ]]; then
  SPECD_SHARED_DIR="$(cd ../shared && pwd)"
fi
export SPECD_SHARED_DIR="${SPECD_SHARED_DIR:-}"
[[ -n "$SPECD_SHARED_DIR" ]] || echo "[test] SPECD_SHARED_DIR not set: golden-data tests will skip" >&2
BUILD_DIR="${SPECD_BUILD_DIR:-build}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 600 "$@"
