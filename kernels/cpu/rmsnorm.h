// Llama RMSNorm on the CPU (see RmsNormArgs in kernels/backend.h).
#ifndef SPECD_KERNELS_CPU_RMSNORM_H_
#define SPECD_KERNELS_CPU_RMSNORM_H_

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

// Per row: ss = canonical dot(x, x) (simd.h), r = 1 / sqrt(ss / dim + eps), y = (x * r) * weight,
// all in f32, as Hugging Face's LlamaRMSNorm. n_tokens == 0 is a no-op.
absl::Status CpuRmsNorm(const RmsNormArgs& args, const CpuContext& ctx);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_RMSNORM_H_
