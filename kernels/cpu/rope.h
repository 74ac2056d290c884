// Rotary position embedding on the CPU (see RopeArgs in kernels/backend.h).
#ifndef SPECD_KERNELS_CPU_ROPE_H_
#define SPECD_KERNELS_CPU_ROPE_H_

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

// Pair i of each head rotates by angle = float(pos) * inv_freq[i] (an f32 product); cos and sin
// of that f32 angle are rounded from double, so they are the correctly rounded values on every
// platform. x0' = x0 * c - x1 * s, x1' = x1 * c + x0 * s. n_tokens == 0 is a no-op.
absl::Status CpuRope(const RopeArgs& args, const CpuContext& ctx);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_ROPE_H_
