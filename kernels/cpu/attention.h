// Grouped-query attention over the paged KV cache on the CPU (see AttentionArgs and PagedKv in
// kernels/backend.h).
#ifndef SPECD_KERNELS_CPU_ATTENTION_H_
#define SPECD_KERNELS_CPU_ATTENTION_H_

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

// One task per (token, head), run on any thread. A task scores slots 0..slot in order
// (canonical dot product of simd.h, times scale), takes the max, exponentiates with std::exp
// and sums in order, accumulates exp-weighted v rows in order with fused multiply-adds, and
// divides by the sum: a two-pass softmax in f32 whose result never depends on n_tokens or the
// thread count. Slots a tree mask hides get weight exactly 0. A bf16/f16 cache is widened to f32
// exactly before the same arithmetic. `out` may be the same buffer as `q` (every score is computed
// before the head's output is written) but must not overlap it otherwise. n_tokens == 0 is a no-op.
absl::Status CpuAttention(const AttentionArgs& args, const CpuContext& ctx);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_ATTENTION_H_
