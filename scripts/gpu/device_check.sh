#!/usr/bin/env bash
# The CUDA back end's checks and benchmarks, in one script for a GPU machine (an H100 or H200 with
# nvcc, CMake, ninja, PyTorch and transformers, but no gRPC). It writes $OUT/summary.txt and, at
# exit, every log in $OUT/logs.tgz (default $OUT: ./gpu-results); the device tool returns at most
# 8 files.
#
# Prepare here, then carry:
#   scripts/gpu/pack.sh       builds the binaries below and packs them with their libraries into
#                             .gpu-pack (carry it: nothing is built on the device);
#   scripts/gpu/fetch_deps.sh only to build on the device instead (.gpu-deps; the build stage).
#
# usage: scripts/gpu/device_check.sh [STAGE...]     (default: every stage, in this order)
#   build        checks the packed binaries run (with no .gpu-pack: an engine-only sm_90 build)
#   conformance  the conformance suite on CUDA (every op, invariance, guard zones) and the
#                CUDA-only tests (tile shapes, split attention, ProcessRows vs CPU, errors, graphs)
#   engine_tests engine-level tests that compare an engine with itself, on CUDA
#                (SPECD_TEST_BACKEND=cuda): batch invariance, draft trees and KV dtypes, prefix
#                caching (cached KV and copy on write against recomputing), greedy
#                speculative == plain for every K, and the chi-square distribution tests
#   hf_parity    logits and greedy tokens against transformers' LlamaForCausalLM
#   spec_parity  greedy speculative == plain decoding in process, K = 1..8, alone and batched
#   matmul       specd's matmul next to cuBLAS on the 3B shapes, and cuBLAS's row invariance
#   decode       batch-1 decode as a fraction of the copy bandwidth, 1B and 3B shapes (bf16,
#                untied), with and without CUDA graphs, and T_v(4)/T_t
#   speedup      speculative speed-up in process, 3B target with an early-exit draft, K = 2, 4, 6
#   hf_generate  transformers' plain and assisted generate() on speedup's 3B checkpoint (run it
#                in the same call as speedup: every call starts on a bare machine)
#   sharing      two processes decoding on the GPU at once against one alone (is MPS needed?)
# Each stage appends to summary.txt; a failed stage is reported and the next one still runs. A
# device call runs at most 10 minutes, and everything stops at $BUDGET seconds (default 540) so
# the logs still come back. Three calls cover it:
#   build conformance engine_tests hf_parity spec_parity | build matmul decode speedup hf_generate
#   | build sharing
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
source scripts/gpu/binaries.sh
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-results}
WORK=${SPECD_GPU_WORK:-/tmp/specd-gpu}
LOGS=$WORK/logs
DEADLINE=$((SECONDS + ${BUDGET:-540}))
mkdir -p "$OUT" "$LOGS" "$WORK/bin"
SUMMARY=$OUT/summary.txt
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(build conformance engine_tests hf_parity spec_parity matmul
                                     decode speedup hf_generate sharing)
export PYTHONUNBUFFERED=1
# The tests' numpy references run on the image's Python, and find the sources here.
SPECD_PYTHON=$(command -v python3)
export SPECD_PYTHON SPECD_SOURCE_DIR=$ROOT
export PATH=/usr/local/cuda/bin:$PATH
trap 'tar -czf "$OUT/logs.tgz" -C "$WORK" logs' EXIT

note() { echo "[device_check] $*" | tee -a "$SUMMARY"; }

# run_timed CMD...: CMD, stopped at the deadline.
run_timed() {
  local left=$((DEADLINE - SECONDS))
  ((left > 5)) || { echo "out of time before: $*"; return 124; }
  timeout -k 5 "$left" "$@"
}

# The binaries: packed (.gpu-pack, from scripts/gpu/pack.sh) or built here. Each is called
# through a wrapper in $WORK/bin that finds the packed libraries, which are not put on every
# process's path: Python and PyTorch keep the machine's own.
if [[ -z ${SPECD_GPU_BUILD:-} && -d .gpu-pack/build ]]; then
  BUILD=$ROOT/.gpu-pack/build
  LIBS=$ROOT/.gpu-pack/lib
  note "packed binaries of $(tr '\n' ' ' <.gpu-pack/commit)"
else
  BUILD=${SPECD_GPU_BUILD:-$ROOT/build-gpu}
  LIBS=""
  if compgen -G ".gpu-deps/*.deb" >/dev/null; then
    PREFIX=/tmp/specd-deps
    [[ -d $PREFIX/usr ]] || for deb in .gpu-deps/*.deb; do dpkg -x "$deb" "$PREFIX"; done
    export CMAKE_PREFIX_PATH=$PREFIX/usr
    # Debian keeps OpenSSL's configuration headers in the multiarch folder.
    export CPATH=$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
    LIBS=$PREFIX/usr/lib/x86_64-linux-gnu
  fi
fi
CUDA_LIBS=/usr/local/cuda/lib64
for b in "${GPU_BINARIES[@]}"; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
    "${LIBS:+$LIBS:}$CUDA_LIBS" "$BUILD/$b" >"$WORK/bin/${b##*/}"
  chmod +x "$WORK/bin/${b##*/}"
done
BIN=$WORK/bin

stage_build() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY"
  if [[ $BUILD != "$ROOT/.gpu-pack/build" ]]; then
    local t0=$SECONDS
    run_timed cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECD_ENGINE_ONLY=ON \
          -DSPECD_CUDA_ARCHITECTURES=90-real >"$LOGS/configure.log" 2>&1 || return 1
    grep -q "CUDA back end ON" "$LOGS/configure.log" ||
      { note "CUDA back end not configured"; return 1; }
    run_timed ninja -C "$BUILD" -j16 "${GPU_TARGETS[@]}" >"$LOGS/build.log" 2>&1 ||
      { tail -40 "$LOGS/build.log"; return 1; }
    note "build: $((SECONDS - t0)) s"
  fi
  # Every binary finds its libraries.
  local missing
  missing=$(for b in "${GPU_BINARIES[@]}"; do
              LD_LIBRARY_PATH=${LIBS:+$LIBS:}$CUDA_LIBS ldd "$BUILD/$b" | grep "not found"
            done | sort -u)
  [[ -z $missing ]] || { note "missing libraries: $missing"; return 1; }
}

# Fails when a CUDA test skipped: a missing or broken back end would otherwise pass.
no_skips() {
  grep -q "^\[  SKIPPED \]" "$@" || return 0
  note "CUDA tests skipped: $(grep -h -B2 '^\[  SKIPPED \]' "$@" | head -6)"
  return 1
}

stage_conformance() {
  run_timed "$BIN/kernels_conformance_test" --gtest_filter='*cuda*:*Cuda*' --gtest_color=no \
      >"$LOGS/conformance.log" 2>&1
  local a=$?
  run_timed "$BIN/kernels_cuda_test" --gtest_color=no >"$LOGS/cuda_test.log" 2>&1
  local b=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$LOGS/conformance.log" \
      "$LOGS/cuda_test.log" | tee -a "$SUMMARY"
  no_skips "$LOGS/conformance.log" "$LOGS/cuda_test.log" && [[ $a -eq 0 && $b -eq 0 ]]
}

stage_engine_tests() {
  local rc=0
  for t in "${GPU_ENGINE_TESTS[@]}"; do
    local name=${t##*/}
    SPECD_TEST_BACKEND=cuda run_timed "$BIN/$name" --gtest_color=no >"$LOGS/$name.log" 2>&1 || rc=1
    echo "$name: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOGS/$name.log" | tr '\n' ' ')" |
        tee -a "$SUMMARY"
  done
  return "$rc"
}

stage_hf_parity() {
  run_timed python3 tests/reference/hf_parity.py --engine-logits "$BIN/engine_logits" \
      --backend cuda --work "$WORK/hf" --out "$LOGS/hf_parity.json" >"$LOGS/hf_parity.log" 2>&1
  local rc=$?
  tail -6 "$LOGS/hf_parity.log"
  tail -1 "$LOGS/hf_parity.log" >>"$SUMMARY"
  return "$rc"
}

stage_spec_parity() {
  local rc=0
  for dtype in f32 bf16; do
    run_timed "$BIN/spec_bench" --check --backend cuda --shape stories110M --untied \
        --dtype "$dtype" --residual-scale 0.3 --draft-layers 2 --ks 1,2,3,4,5,6,7,8 --prompts 8 \
        --new-tokens 64 --model-dir "$WORK/models" >"$LOGS/spec_parity_$dtype.log" 2>&1 || rc=1
    tail -1 "$LOGS/spec_parity_$dtype.log" | sed "s/^/$dtype: /" | tee -a "$SUMMARY"
  done
  return "$rc"
}

stage_matmul() {
  run_timed "$BIN/cuda_matmul_bench" --reps 50 >"$LOGS/matmul.log" 2>&1
  local rc=$?
  tee -a "$SUMMARY" <"$LOGS/matmul.log"
  return "$rc"
}

stage_decode() {
  local rc=0
  for shape in llama-3.2-1b llama-3.2-3b; do
    run_timed "$BIN/decode_bench" --backend cuda --shape "$shape" --untied --dtypes bf16 \
        --graphs on,off --context 256 --k 4 --steps 50 --model-dir "$WORK/models" \
        >"$LOGS/decode_$shape.log" 2>&1 || rc=1
    grep -v "^writing\|^measuring" "$LOGS/decode_$shape.log" | tee -a "$SUMMARY"
  done
  return "$rc"
}

# The 3B target and its early-exit draft: the residual scale and depth are the knobs of the
# agreement rate (DESIGN.md, "Synthetic pairs"); the acceptance column shows what they gave.
SPEC_SCALE=${SPECD_GPU_SPEC_SCALE:-0.06}
SPEC_LAYERS=${SPECD_GPU_SPEC_LAYERS:-4}
SPEC_MODEL=$WORK/models/llama-3.2-3b-untied-bf16-s$(printf '%f' "$SPEC_SCALE")
stage_speedup() {
  run_timed "$BIN/spec_bench" --speedup --backend cuda --shape llama-3.2-3b --untied \
      --dtype bf16 --residual-scale "$SPEC_SCALE" --draft-layers "$SPEC_LAYERS" --ks 2,4,6 \
      --new-tokens 256 --model-dir "$WORK/models" >"$LOGS/speedup.log" 2>&1
  local rc=$?
  grep -v "^writing" "$LOGS/speedup.log" | tee -a "$SUMMARY"
  return "$rc"
}

stage_hf_generate() {
  [[ -f $SPEC_MODEL/config.json ]] ||
    { note "no $SPEC_MODEL: run the speedup stage first, in the same call"; return 1; }
  run_timed python3 tests/reference/hf_generate_bench.py --target "$SPEC_MODEL" \
      --draft-layers "$SPEC_LAYERS" --new-tokens 256 --out "$LOGS/hf_generate.json" \
      >"$LOGS/hf_generate.log" 2>&1
  local rc=$?
  tail -4 "$LOGS/hf_generate.log" | tee -a "$SUMMARY"
  return "$rc"
}

stage_sharing() {
  # One process alone, then two at once (each with its own context, time-sliced without MPS).
  local args=(--backend cuda --shape llama-3.2-1b --untied --dtypes bf16 --graphs on
              --context 256 --steps 100 --model-dir "$WORK/models")
  run_timed "$BIN/decode_bench" "${args[@]}" >"$LOGS/sharing_alone.log" 2>&1 || return 1
  run_timed "$BIN/decode_bench" "${args[@]}" >"$LOGS/sharing_a.log" 2>&1 &
  local a=$!
  run_timed "$BIN/decode_bench" "${args[@]}" >"$LOGS/sharing_b.log" 2>&1
  local rc=$?
  wait "$a" || rc=1
  for f in alone a b; do
    echo "$f: $(grep '^bf16' "$LOGS/sharing_$f.log")" | tee -a "$SUMMARY"
  done
  return "$rc"
}

failed=()
for stage in "${STAGES[@]}"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    note "unknown stage $stage"
    exit 2
  fi
  t0=$SECONDS
  note "== $stage"
  if "stage_$stage"; then
    note "$stage: ok ($((SECONDS - t0)) s)"
  else
    note "$stage: FAILED ($((SECONDS - t0)) s)"
    failed+=("$stage")
    [[ $stage == build ]] && break
  fi
done
[[ ${#failed[@]} -eq 0 ]] || { note "failed stages: ${failed[*]}"; exit 1; }
