#!/usr/bin/env bash
# The CUDA back end's checks and benchmarks, in one script for a GPU machine (an H100 or H200 with
# nvcc, CMake, ninja, PyTorch and transformers, but no gRPC). Results go under $OUT (default
# ./gpu-results). Run scripts/gpu/fetch_deps.sh on a Debian machine first and carry .gpu-deps.
#
# usage: scripts/gpu/device_check.sh [STAGE...]     (default: every stage, in this order)
#   build        engine-only build (-DSPECD_ENGINE_ONLY=ON, sm_90), only the targets used below
#   conformance  the conformance suite on CUDA (every op, invariance, guard zones) and the
#                CUDA-only tests (tile shapes, split attention, ProcessRows vs CPU, errors, graphs)
#   engine_tests engine-level tests that compare an engine with itself, on CUDA
#                (SPECD_TEST_BACKEND=cuda): batch invariance, draft trees and KV dtypes, greedy
#                speculative == plain for every K, and the chi-square distribution tests
#   hf_parity    logits and greedy tokens against transformers' LlamaForCausalLM
#   spec_parity  greedy speculative == plain decoding in process, K = 1..8, alone and batched
#   matmul       specd's matmul next to cuBLAS on the 3B shapes, and cuBLAS's row invariance
#   decode       batch-1 decode as a fraction of the copy bandwidth, 1B and 3B shapes (bf16,
#                untied), with and without CUDA graphs, and T_v(4)/T_t
#   speedup      speculative speed-up in process, 3B target with an early-exit draft, K = 2, 4, 6
#   sharing      two processes decoding on the GPU at once against one alone (is MPS needed?)
#   hf_generate  transformers' plain and assisted generate() on the 3B checkpoint
# Each stage appends to $OUT/summary.txt; a failed stage is reported and the next one still runs.
# A device call is limited to 10 minutes: run the stages in two or three calls, e.g.
#   build conformance engine_tests hf_parity spec_parity  |  build matmul decode speedup
#   |  build sharing hf_generate
# (build is a no-op when the machine is still warm with the last build).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-results}
BUILD=${SPECD_GPU_BUILD:-$ROOT/build-gpu}
WORK=${SPECD_GPU_WORK:-/tmp/specd-gpu}
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(build conformance engine_tests hf_parity spec_parity matmul
                                     decode speedup sharing hf_generate)
export PYTHONUNBUFFERED=1

note() { echo "[device_check] $*" | tee -a "$SUMMARY"; }

# The C++ libraries from .gpu-deps (Debian 12 packages) under a prefix of their own.
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  PREFIX=/tmp/specd-deps
  if [[ ! -d $PREFIX/usr ]]; then
    for deb in .gpu-deps/*.deb; do dpkg -x "$deb" "$PREFIX"; done
  fi
  export CMAKE_PREFIX_PATH=$PREFIX/usr
  export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=/usr/local/cuda/bin:$PATH

TOOLS=$BUILD/tools/bench/engine
ENGINE_TESTS=(tests/common/engine/engine_batch_invariance_test
              tests/common/engine/engine_tree_and_kv_dtype_test
              tests/services/coordinator/speculation_round_test
              tests/services/coordinator/distribution_test)
TARGETS=(kernels_conformance_test kernels_cuda_test engine_logits spec_bench decode_bench
         cuda_matmul_bench)
for t in "${ENGINE_TESTS[@]}"; do TARGETS+=("${t##*/}"); done

stage_build() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY"
  local t0=$SECONDS
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECD_ENGINE_ONLY=ON \
        -DSPECD_CUDA_ARCHITECTURES=90-real >"$OUT/configure.log" 2>&1 || return 1
  grep -q "CUDA back end ON" "$OUT/configure.log" || { note "CUDA back end not configured"; return 1; }
  ninja -C "$BUILD" -j16 "${TARGETS[@]}" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
  note "build: $((SECONDS - t0)) s"
}

stage_conformance() {
  "$BUILD/tests/kernels/conformance/kernels_conformance_test" --gtest_filter='*cuda*:*Cuda*' \
      --gtest_color=no >"$OUT/conformance.log" 2>&1
  local a=$?
  "$BUILD/tests/kernels/cuda/kernels_cuda_test" --gtest_color=no >"$OUT/cuda_test.log" 2>&1
  local b=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$OUT/conformance.log" "$OUT/cuda_test.log" | tee -a "$SUMMARY"
  [[ $a -eq 0 && $b -eq 0 ]]
}

stage_engine_tests() {
  local rc=0
  for t in "${ENGINE_TESTS[@]}"; do
    SPECD_TEST_BACKEND=cuda "$BUILD/$t" --gtest_color=no >"$OUT/${t##*/}.log" 2>&1 || rc=1
    echo "${t##*/}: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/${t##*/}.log" | tr '\n' ' ')" |
        tee -a "$SUMMARY"
  done
  return "$rc"
}

stage_hf_parity() {
  python3 tests/reference/hf_parity.py --engine-logits "$TOOLS/engine_logits" --backend cuda \
      --work "$WORK/hf" --out "$OUT/hf_parity.json" 2>&1 | tee "$OUT/hf_parity.log" | tail -6
  local rc=${PIPESTATUS[0]}
  tail -1 "$OUT/hf_parity.log" >>"$SUMMARY"
  return "$rc"
}

stage_spec_parity() {
  local rc=0
  for dtype in f32 bf16; do
    "$TOOLS/spec_bench" --check --backend cuda --shape stories110M --untied --dtype "$dtype" \
        --residual-scale 0.3 --draft-layers 2 --ks 1,2,3,4,5,6,7,8 --prompts 8 --new-tokens 64 \
        --model-dir "$WORK/models" >"$OUT/spec_parity_$dtype.log" 2>&1 || rc=1
    tail -1 "$OUT/spec_parity_$dtype.log" | sed "s/^/$dtype: /" | tee -a "$SUMMARY"
  done
  return "$rc"
}

stage_matmul() {
  "$BUILD/tools/bench/kernels/cuda_matmul_bench" --reps 50 >"$OUT/matmul.log" 2>&1
  local rc=$?
  tee -a "$SUMMARY" <"$OUT/matmul.log"
  return "$rc"
}

stage_decode() {
  local rc=0
  for shape in llama-3.2-1b llama-3.2-3b; do
    "$TOOLS/decode_bench" --backend cuda --shape "$shape" --untied --dtypes bf16 \
        --graphs on,off --context 256 --k 4 --steps 50 --model-dir "$WORK/models" \
        >"$OUT/decode_$shape.log" 2>&1 || rc=1
    cat "$OUT/decode_$shape.log" | grep -v "^writing\|^measuring" | tee -a "$SUMMARY"
  done
  return "$rc"
}

# The 3B target and its early-exit draft: the residual scale and depth are the knobs of the
# agreement rate (DESIGN.md, "Synthetic pairs"); the acceptance column shows what they gave.
SPEC_SCALE=${SPECD_GPU_SPEC_SCALE:-0.06}
SPEC_LAYERS=${SPECD_GPU_SPEC_LAYERS:-4}
stage_speedup() {
  "$TOOLS/spec_bench" --speedup --backend cuda --shape llama-3.2-3b --untied --dtype bf16 \
      --residual-scale "$SPEC_SCALE" --draft-layers "$SPEC_LAYERS" --ks 2,4,6 --new-tokens 256 \
      --model-dir "$WORK/models" >"$OUT/speedup.log" 2>&1
  local rc=$?
  grep -v "^writing" "$OUT/speedup.log" | tee -a "$SUMMARY"
  return "$rc"
}

stage_sharing() {
  # One process alone, then two at once (each with its own context, time-sliced without MPS).
  local args=(--backend cuda --shape llama-3.2-1b --untied --dtypes bf16 --graphs on
              --context 256 --steps 100 --model-dir "$WORK/models")
  "$TOOLS/decode_bench" "${args[@]}" >"$OUT/sharing_alone.log" 2>&1 || return 1
  "$TOOLS/decode_bench" "${args[@]}" >"$OUT/sharing_a.log" 2>&1 &
  local a=$!
  "$TOOLS/decode_bench" "${args[@]}" >"$OUT/sharing_b.log" 2>&1
  local rc=$?
  wait "$a" || rc=1
  for f in alone a b; do
    echo "$f: $(grep '^bf16' "$OUT/sharing_$f.log")" | tee -a "$SUMMARY"
  done
  return "$rc"
}

stage_hf_generate() {
  python3 tests/reference/hf_generate_bench.py \
      --target "$WORK/models/llama-3.2-3b-untied-bf16-s$(printf '%f' "$SPEC_SCALE")" \
      --draft-layers "$SPEC_LAYERS" --new-tokens 256 --out "$OUT/hf_generate.json" 2>&1 |
      tee "$OUT/hf_generate.log" | tail -4 | tee -a "$SUMMARY"
  return "${PIPESTATUS[0]}"
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
