// y = x · wᵀ on the GPU (see MatmulArgs in kernels/backend.h), beside kernels/cpu/matmul.h.
// Every GEMM of the forward pass (q/k/v/o, gate/up/down and the classifier) runs here, on CUDA
// cores in fp32 with bf16/f16/f32 weights widened in registers; cuBLAS serves none of them (see
// docs/architecture.md: it offers no f32-activation x bf16-weight product with fp32 rounding, and
// it promises no row invariance).
//
// Invariance: y[t, o] has ONE reduction order, fixed by w.cols alone. The columns are cut into
// chunks of 8; lane l of a warp (l in 0..31) accumulates, with one fused multiply-add per
// element, chunks l, l + 32, l + 64, ... in ascending order and the 8 elements of each chunk in
// ascending order (a last partial chunk comes last, in the lane that owns its index); the 32 lane
// sums are then added by the xor butterfly 16, 8, 4, 2, 1. The launcher picks a tile shape
// (tokens and rows per warp) from n_tokens, for speed only: every shape performs exactly these
// operations for every output, so a row's bits never depend on the batch. There is no split-K.
#ifndef SPECD_KERNELS_CUDA_MATMUL_H_
#define SPECD_KERNELS_CUDA_MATMUL_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// n_tokens == 0 is a no-op. `tokens_per_warp` 0 lets the launcher choose (1, 2, 4 or 8 by
// n_tokens); tests force each to show they agree bit for bit.
absl::Status LaunchMatmul(const MatmulArgs& args, const CudaContext& ctx, cudaStream_t stream,
                          int tokens_per_warp = 0);
// The parts in one launch: the grid's blocks are the parts' row groups one after the other, and
// each warp runs exactly a plain Matmul's operations for its rows (an accumulating part adds the
// finished sum to y), so every part has its own Matmul's bits. A swiglu group (gate, up) launches
// warps over the gate's rows that reduce the same rows of both and write silu(gate) * up with
// SwiGlu's rounding: one launch and no pass over the products instead of two of each.
// An input_norm over one tile of tokens (the launch's grid has one token tile) is folded in: each
// block finds its tokens' 1/rms with RmsNorm's reduction (RowInvRms) and normalizes x as it loads
// it; over more tokens RmsNorm launches first, into input_norm.normed. Same bits either way.
absl::Status LaunchMatmulGroup(const MatmulGroupArgs& args, const CudaContext& ctx,
                               cudaStream_t stream, int tokens_per_warp = 0);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_MATMUL_H_
