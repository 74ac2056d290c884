# shellcheck shell=bash
# Sourced by pack.sh and device_check.sh: the binaries the device checks run, as paths under a
# build tree (each one's CMake target is its file name).
GPU_ENGINE_TESTS=(tests/common/engine/engine_backend_self_check_test
                  tests/common/engine/engine_batch_invariance_test
                  tests/common/engine/engine_tree_and_kv_dtype_test
                  tests/common/engine/engine_prefix_cache_test
                  tests/common/worker/worker_adversarial_test
                  tests/services/coordinator/speculation_round_test
                  tests/services/coordinator/distribution_test)
# Engine-only (SPECD_ENGINE_ONLY=ON): they need no gRPC, so the device can also build them.
GPU_BINARIES=(tests/kernels/conformance/kernels_conformance_test
              tests/kernels/cuda/kernels_cuda_test
              tools/bench/engine/engine_logits
              tools/bench/engine/spec_bench
              tools/bench/engine/decode_bench
              tools/bench/kernels/cuda_matmul_bench
              tools/bench/kernels/cuda_attention_bench
              tools/bench/kernels/sampling_rows_bench
              "${GPU_ENGINE_TESTS[@]}")
# The service, its client and the worker-call benchmark, from a full build (gRPC,
# prometheus-cpp): only packed, since the device has no gRPC. `specd serve` finds the services
# beside it in this same layout.
GPU_SERVICE_BINARIES=(tools/specd
                      services/coordinator/specd-coordinator
                      services/target_worker/specd-target-worker
                      services/draft_worker/specd-draft-worker
                      tools/bench/services/worker_rpc_bench)
GPU_TARGETS=()
for b in "${GPU_BINARIES[@]}"; do GPU_TARGETS+=("${b##*/}"); done
# The workers' targets are not named as their files.
GPU_SERVICE_TARGETS=(specd specd-coordinator specd_target_worker specd_draft_worker worker_rpc_bench)
