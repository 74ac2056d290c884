// y = x · wᵀ on the CPU (see MatmulArgs in kernels/backend.h).
#ifndef SPECD_KERNELS_CPU_MATMUL_H_
#define SPECD_KERNELS_CPU_MATMUL_H_

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

// Threads split the output rows; each (token, row) output is one canonical dot product
// (simd.h), so the result is bit-exact whatever n_tokens and the thread count. n_tokens == 0
// is a no-op.
absl::Status CpuMatmul(const MatmulArgs& args, const CpuContext& ctx);
// The parts' rows are split among the threads together, so a group costs one dispatch.
absl::Status CpuMatmulGroup(const MatmulGroupArgs& args, const CpuContext& ctx);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_MATMUL_H_
