#!/usr/bin/env bash
# The CUDA back end's checks and benchmarks, in one script for a GPU machine (an H100 or H200 with
# nvcc, CMake, ninja, PyTorch and transformers, but no gRPC). It writes $OUT/summary.txt and, at
# exit, every log in $OUT/logs.tgz (default $OUT: ./gpu-results); the device tool returns at most
# 8 files.
#
# Prepare here, then carry:
#   scripts/gpu/pack.sh       builds the binaries below and packs them with their libraries into
#                             .gpu-pack (carry it: nothing is built on the device);
#   scripts/gpu/fetch_deps.sh only to build on the device instead (.gpu-deps; the build stage; the
#                             service stages then cannot run, the device having no gRPC).
#
# usage: scripts/gpu/device_check.sh [STAGE...]     (default: every stage, in this order)
#   build          checks the packed binaries run (with no .gpu-pack: an engine-only sm_90 build)
#   conformance    the conformance suite on CUDA (every op, invariance, guard zones) and the
#                  CUDA-only tests (tile shapes, split attention, ProcessRows vs CPU, errors, graphs)
#   hf_parity      logits and greedy tokens against transformers' LlamaForCausalLM
#   spec_parity    greedy speculative == plain decoding in process, K = 1..8, alone and batched
#   decode         batch-1 decode as a fraction of the copy bandwidth, 1B and 3B shapes (bf16,
#                  untied), with and without CUDA graphs, and T_v(4)/T_t
#   attention      paged attention alone at the 1B and 3B decode and verify shapes, contexts 128
#                  to 8192: what it adds per token next to streaming the weights once
#   engine_tests   engine-level tests that compare an engine with itself, on CUDA
#                  (SPECD_TEST_BACKEND=cuda): the start-up self-check on the 1B and 3B head
#                  shapes in every dtype (every CUDA engine runs it first), batch invariance, draft trees and KV dtypes, prefix
#                  caching (cached KV and copy on write against recomputing), a worker under
#                  malformed requests against a twin, greedy speculative == plain for every
#                  K, and the chi-square distribution tests
#   speedup        speculative speed-up in process, 3B target with an early-exit draft, K = 2, 4, 6
#   serve_speedup  the same over the services: `specd serve --backend cuda` (the round's calls
#                  on the workers' same-host sockets, the rest on gRPC) and `specd bench
#                  --compare` (speed-up, efficiency, coordinator overhead per round), then where
#                  a worker call's time goes over gRPC and over the socket (worker_rpc_bench),
#                  packed services only
#   hf_generate    transformers' plain and assisted generate() on the 3B pair's checkpoint
#   concurrency    tokens/s against 1..64 streams over gRPC, K = 0, fixed K = 4 and adaptive K
#   sanitize       compute-sanitizer's memcheck and racecheck over the CUDA-only tests
#   matmul         specd's matmul next to cuBLAS on the 3B shapes, and cuBLAS's row invariance;
#                  the q/k/v projections as one grouped launch against three
#   sampling       ProcessRows at Llama 3's vocabulary for greedy, temperature, top-k, top-p and
#                  all filters, 1 and 5 rows (what a sampled request adds per draft step)
#   sharing        two processes decoding on the GPU at once against one alone (is MPS needed?)
# The order is the issue's order of priority. Each stage appends to summary.txt; a failed stage is
# reported and the next one still runs. Everything stops at $BUDGET seconds (default 480) so the
# logs still come back within the call's limit; stages left are named in the summary, to pass to
# the next call. A session has 15 minutes of device time in all, the machine's start included, so
# plan on two calls: the default list, then what the first one left.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
source scripts/gpu/binaries.sh
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-results}
WORK=${SPECD_GPU_WORK:-/tmp/specd-gpu}
LOGS=$WORK/logs
DEADLINE=$((SECONDS + ${BUDGET:-480}))
mkdir -p "$OUT" "$LOGS" "$WORK/bin"
SUMMARY=$OUT/summary.txt
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(build conformance hf_parity spec_parity decode attention
                                     engine_tests speedup serve_speedup hf_generate concurrency
                                     sanitize matmul sampling sharing)
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
PACKED=""
if [[ -z ${SPECD_GPU_BUILD:-} && -f .gpu-pack/pack.tar.xz ]]; then
  PACKED=1
  rm -rf "$WORK/pack" && mkdir -p "$WORK/pack"
  # Python's tarfile where the image has no xz program.
  tar -xJf .gpu-pack/pack.tar.xz -C "$WORK/pack" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        .gpu-pack/pack.tar.xz "$WORK/pack" || { note "cannot unpack .gpu-pack"; exit 1; }
  BUILD=$WORK/pack/build
  LIBS=$WORK/pack/lib
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
WRAPPED=("${GPU_BINARIES[@]}")
# specd finds the services beside it (tools/ and services/ of one tree) through /proc/self/exe,
# and its children inherit the wrapper's library path.
[[ -x $BUILD/${GPU_SERVICE_BINARIES[0]} ]] && WRAPPED+=("${GPU_SERVICE_BINARIES[@]}")
for b in "${WRAPPED[@]}"; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
    "${LIBS:+$LIBS:}$CUDA_LIBS" "$BUILD/$b" >"$WORK/bin/${b##*/}"
  chmod +x "$WORK/bin/${b##*/}"
done
BIN=$WORK/bin

stage_build() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY"
  if [[ -z $PACKED ]]; then
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
  missing=$(for b in "${WRAPPED[@]}"; do
              LD_LIBRARY_PATH=${LIBS:+$LIBS:}$CUDA_LIBS ldd "$BUILD/$b" | grep "not found"
            done | sort -u)
  [[ -z $missing ]] || { note "missing libraries: $missing"; return 1; }
  [[ -x $BIN/specd ]] || note "no service binaries: serve_speedup and concurrency cannot run"
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

# compute-sanitizer (in the device image) over the CUDA-only tests: memcheck for out-of-bounds
# and misaligned accesses, racecheck for shared-memory races in the kernels with block-wide
# reductions and merges. Called on the binary itself, with the wrapper's library path.
stage_sanitize() {
  command -v compute-sanitizer >/dev/null || { note "no compute-sanitizer"; return 1; }
  local test=$BUILD/tests/kernels/cuda/kernels_cuda_test rc=0 tool filter
  for tool in memcheck racecheck; do
    filter='*'
    [[ $tool == racecheck ]] && filter='*Attention*:*ProcessRows*:*CopyKvRows*'
    LD_LIBRARY_PATH=${LIBS:+$LIBS:}$CUDA_LIBS run_timed compute-sanitizer --tool "$tool" \
        --error-exitcode 3 "$test" --gtest_filter="$filter" --gtest_color=no \
        >"$LOGS/sanitize_$tool.log" 2>&1 || rc=1
    echo "$tool: $(grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY)' "$LOGS/sanitize_$tool.log" |
                   tr '\n' ' ')$(grep -cE '^\[  FAILED  \]' "$LOGS/sanitize_$tool.log") failed" |
        tee -a "$SUMMARY"
  done
  no_skips "$LOGS"/sanitize_*.log && return "$rc"
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

stage_sampling() {
  run_timed "$BIN/sampling_rows_bench" --backend cuda --reps 50 >"$LOGS/sampling.log" 2>&1
  local rc=$?
  tee -a "$SUMMARY" <"$LOGS/sampling.log"
  return "$rc"
}

stage_attention() {
  run_timed "$BIN/cuda_attention_bench" --reps 20 >"$LOGS/attention.log" 2>&1
  local rc=$?
  tee -a "$SUMMARY" <"$LOGS/attention.log"
  return "$rc"
}

stage_decode() {
  local rc=0
  # Decode reads the same bytes whatever the weights' values: the 3B pair's target serves, and
  # the later stages find it written (one 6 GB checkpoint fewer to make on the device's clock).
  if [[ $SPEC_SHAPE == llama-3.2-3b ]] && ensure_spec_model; then
    ln -sfn "$SPEC_MODEL" "$WORK/models/llama-3.2-3b-untied-bf16"
  fi
  for shape in llama-3.2-1b llama-3.2-3b; do
    run_timed "$BIN/decode_bench" --backend cuda --shape "$shape" --untied --dtypes bf16 \
        --graphs on,off --pdl on,off --context 256 --k 4 --steps 50 --model-dir "$WORK/models" \
        >"$LOGS/decode_$shape.log" 2>&1 || rc=1
    grep -v "^writing\|^measuring" "$LOGS/decode_$shape.log" | tee -a "$SUMMARY"
  done
  return "$rc"
}

# SPECD_GPU_BACKEND=cpu and SPECD_GPU_SPEC_SHAPE=tiny try the speed stages' plumbing on a machine
# without a GPU (what they measure then means nothing).
BACKEND=${SPECD_GPU_BACKEND:-cuda}
# The 3B target and its early-exit draft: the residual scale and depth are the knobs of the
# agreement rate (DESIGN.md, "Synthetic pairs"); the alpha column shows what they gave.
SPEC_SCALE=${SPECD_GPU_SPEC_SCALE:-0.06}
SPEC_LAYERS=${SPECD_GPU_SPEC_LAYERS:-4}
SPEC_SHAPE=${SPECD_GPU_SPEC_SHAPE:-llama-3.2-3b}
SPEC_MODEL=$WORK/models/$SPEC_SHAPE-untied-bf16-s$(printf '%f' "$SPEC_SCALE")
stage_speedup() {
  run_timed "$BIN/spec_bench" --speedup --backend "$BACKEND" --shape "$SPEC_SHAPE" --untied \
      --dtype bf16 --residual-scale "$SPEC_SCALE" --draft-layers "$SPEC_LAYERS" --ks 2,4,6 \
      --new-tokens 256 --model-dir "$WORK/models" >"$LOGS/speedup.log" 2>&1
  local rc=$?
  grep -v "^writing" "$LOGS/speedup.log" | tee -a "$SUMMARY"
  return "$rc"
}

# ensure_spec_model: the 3B pair's target, as the speedup stage writes it (spec_bench names it;
# `specd synth` writes the same checkpoint: untied, seed 1), for stages run in another call.
ensure_spec_model() {
  [[ -f $SPEC_MODEL/config.json ]] && return 0
  [[ -x $BIN/specd ]] || { note "no $SPEC_MODEL and no packed specd to write it"; return 1; }
  run_timed "$BIN/specd" synth --shape "$SPEC_SHAPE" --dtype bf16 --residual-scale "$SPEC_SCALE" \
      --out "$SPEC_MODEL" >"$LOGS/synth_3b.log" 2>&1 ||
    { note "specd synth failed: $(tail -2 "$LOGS/synth_3b.log")"; return 1; }
}

# serve_3b LOG ARGS...: `specd serve` of the 3B pair on the GPU, in the background; sets SERVE_PID
# and SERVE_ADDRESS once it listens.
serve_3b() {
  local log=$1
  shift
  [[ -x $BIN/specd ]] || { note "no packed service binaries (scripts/gpu/pack.sh packs them)"; return 1; }
  ensure_spec_model || return 1
  "$BIN/specd" serve --listen 127.0.0.1:0 --backend "$BACKEND" --target "$SPEC_MODEL" \
      --draft-exit-layer "$SPEC_LAYERS" --kv-dtype bf16 "$@" >"$log" 2>&1 &
  SERVE_PID=$!
  SERVE_ADDRESS=""
  while ((SECONDS < DEADLINE)) && kill -0 "$SERVE_PID" 2>/dev/null; do
    SERVE_ADDRESS=$(sed -n 's/^listening on //p' "$log")
    [[ -n $SERVE_ADDRESS ]] && return 0
    sleep 0.2
  done
  note "specd serve did not start: $(tail -3 "$log")"
  stop_serve
  return 1
}

stop_serve() {
  [[ -n ${SERVE_PID:-} ]] || return 0
  kill -INT "$SERVE_PID" 2>/dev/null
  wait "$SERVE_PID" 2>/dev/null
  SERVE_PID=""
}

# memory_report SERVE_LOG: what each worker of a running `specd serve --metrics` holds on the
# device (nvidia-smi) against what its metrics account for (weights, KV, scratch, rows). The rest
# is the CUDA context and the runtime's own, which the memory share reserves 256 MiB for
# (kReserveFixedBytes in common/engine/llama_engine.cc); also the device's use against the share.
memory_report() {
  python3 - "$1" <<'PY'
import re, subprocess, sys, urllib.request
log = open(sys.argv[1]).read()
GiB = float(1 << 30)
def smi(query, what):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{what}={query}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    except FileNotFoundError:  # the CPU dry run of the speed stages
        return []
    return [l.split(", ") for l in out.strip().splitlines() if l.strip()]
apps = {int(p): int(m) << 20 for p, m in smi("pid,used_memory", "compute-apps")}
gpu = smi("memory.used,memory.total", "gpu")
accounted_all = 0
for name in ("target worker", "draft worker"):
    pid = re.search(rf"{name} pid (\d+)", log)
    url = re.search(rf"{name} metrics on (\S+)", log)
    if not pid or not url:
        print(f"memory: no pid or metrics address for the {name} in the serve log")
        continue
    kinds = {}
    for line in urllib.request.urlopen(url.group(1), timeout=10).read().decode().splitlines():
        m = re.match(r'specd_worker_memory_bytes\{kind="(\w+)"\} (\S+)', line)
        if m:
            kinds[m.group(1)] = float(m.group(2))
    device = sum(v for k, v in kinds.items() if k != "staging")
    accounted_all += device
    held = apps.get(int(pid.group(1)))
    parts = ", ".join(f"{k} {v / GiB:.2f}" for k, v in kinds.items())
    print(f"memory: {name}: accounted {device / GiB:.2f} GiB ({parts})"
          + (f"; nvidia-smi {held / GiB:.2f} GiB, so context and runtime "
             f"{(held - device) / GiB:.2f} GiB (the share reserves 0.25)" if held else
             "; nvidia-smi shows no per-process use (a container's PID namespace?)"))
if gpu:
    used, total = (int(x) << 20 for x in gpu[0])
    print(f"memory: device {used / GiB:.2f} of {total / GiB:.2f} GiB used ({used / total:.3f}; "
          f"the pair's share is 0.9), of which the workers' metrics account for "
          f"{accounted_all / GiB:.2f} GiB")
PY
}

# bench_summary JSON: one line per arm (speed-up, efficiency, the coordinator's overhead per round).
bench_summary() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
speedups = {c["label"]: c for c in r.get("compare", [])}
for a in r["arms"]:
    c = speedups.get(a["label"], {})
    def f(x, fmt):
        return "-" if x is None else fmt % x
    print(f"streams {r['config']['streams']} K={a['k']} {a['k_policy'][9:].lower()}"
          f"{f(a.get('mean_k'), ' (mean K %.2f)') if a['k_policy'] == 'K_POLICY_ADAPTIVE' else ''}: "
          f"{f(a.get('output_tokens_per_s'), '%.1f')} tok/s, "
          f"alpha {f(a.get('alpha'), '%.3f')}, round {f(a.get('round_ms'), '%.2f')} ms, "
          f"overhead {f(a.get('overhead_ms'), '%.3f')} ms "
          f"({f(100 * a['overhead_fraction'] if a.get('overhead_fraction') is not None else None, '%.1f')}%)"
          + (f", speed-up {f(c.get('measured_speedup'), '%.3f')} of engine-limited "
             f"{f(c.get('engine_limited_speedup'), '%.3f')} (efficiency {f(c.get('efficiency'), '%.3f')})"
             if c else ""))
PY
}

stage_serve_speedup() {
  serve_3b "$LOGS/serve_speedup_server.log" --metrics || return 1
  memory_report "$LOGS/serve_speedup_server.log" 2>&1 | tee -a "$SUMMARY"
  run_timed "$BIN/specd" bench --server "$SERVE_ADDRESS" --compare --k 2,4,6 --streams 1 \
      --max-tokens 256 --repeats 2 --quiet --json "$LOGS/serve_speedup.json" \
      >"$LOGS/serve_speedup.log" 2>&1
  local rc=$?
  # Where a worker call's time goes beyond the forward pass (gRPC, the engine-thread hand-off,
  # the codec), against the same target worker.
  local target
  target=$(sed -n 's/^specd serve: target worker pid [0-9]* on //p' "$LOGS/serve_speedup_server.log")
  if [[ -n $target ]]; then
    run_timed "$BIN/worker_rpc_bench" --target "$target" --calls 1000 \
        --json "$LOGS/worker_rpc.json" >"$LOGS/worker_rpc.log" 2>&1
    tee -a "$SUMMARY" <"$LOGS/worker_rpc.log"
  fi
  stop_serve
  ((rc == 0)) || { tail -5 "$LOGS/serve_speedup.log" | tee -a "$SUMMARY"; return "$rc"; }
  bench_summary "$LOGS/serve_speedup.json" | tee -a "$SUMMARY"
}

stage_concurrency() {
  serve_3b "$LOGS/concurrency_server.log" --max-running 64 || return 1
  local rc=0 streams policy extra
  for streams in 1 2 4 8 16 32 64; do
    for policy in fixed adaptive; do
      extra=()
      [[ $policy == adaptive ]] && extra=(--adaptive)
      run_timed "$BIN/specd" bench --server "$SERVE_ADDRESS" --compare --k 4 --streams "$streams" \
          --requests $((2 * streams)) --max-tokens 128 --repeats 1 --quiet "${extra[@]}" \
          --json "$LOGS/concurrency_${policy}_$streams.json" \
          >"$LOGS/concurrency_${policy}_$streams.log" 2>&1 || { rc=1; break 2; }
      bench_summary "$LOGS/concurrency_${policy}_$streams.json" | tee -a "$SUMMARY"
    done
  done
  stop_serve
  return "$rc"
}

stage_hf_generate() {
  ensure_spec_model || return 1
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

for stage in "${STAGES[@]}"; do
  declare -F "stage_$stage" >/dev/null || { note "unknown stage $stage"; exit 2; }
done
failed=()
for i in "${!STAGES[@]}"; do
  stage=${STAGES[$i]}
  if ((DEADLINE - SECONDS < 10)); then
    note "out of time; stages left for the next call: build ${STAGES[*]:$i}"
    failed+=("${STAGES[@]:$i}")
    break
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
