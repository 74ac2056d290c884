# shellcheck shell=bash
# Sourced by pack.sh and device_check.sh: the engine-only binaries the device checks run, as paths
# under a build tree (each one's CMake target is its file name).
GPU_ENGINE_TESTS=(tests/common/engine/engine_batch_invariance_test
                  tests/common/engine/engine_tree_and_kv_dtype_test
                  tests/common/engine/engine_prefix_cache_test
                  tests/services/coordinator/speculation_round_test
                  tests/services/coordinator/distribution_test)
GPU_BINARIES=(tests/kernels/conformance/kernels_conformance_test
              tests/kernels/cuda/kernels_cuda_test
              tools/bench/engine/engine_logits
              tools/bench/engine/spec_bench
              tools/bench/engine/decode_bench
              tools/bench/kernels/cuda_matmul_bench
              "${GPU_ENGINE_TESTS[@]}")
GPU_TARGETS=()
for b in "${GPU_BINARIES[@]}"; do GPU_TARGETS+=("${b##*/}"); done
