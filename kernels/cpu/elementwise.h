// Row-wise CPU ops with no reduction: SwiGLU, the embedding lookup and the row
// gather (see the Args structs in kernels/backend.h). Each output element depends only on its own
// inputs, so these are batch invariant by construction. n_tokens / n == 0 is a no-op.
#ifndef SPECD_KERNELS_CPU_ELEMENTWISE_H_
#define SPECD_KERNELS_CPU_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

// out = gate / (1 + exp(-gate)) * up, in f32 with std::exp.
absl::Status CpuSwiGlu(const SwiGluArgs& args, const CpuContext& ctx);

// Also checks every id against table.rows.
absl::Status CpuEmbedding(const EmbeddingArgs& args, const CpuContext& ctx);

// Also checks every row index against n_src.
absl::Status CpuGatherRows(const GatherRowsArgs& args, const CpuContext& ctx);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_ELEMENTWISE_H_
