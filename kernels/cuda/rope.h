// Rotary embedding on the GPU (see RopeArgs in kernels/backend.h), beside kernels/cpu/rope.h.
// The llama3-scaled inverse frequencies come precomputed (common/engine/device_weights.cc).
// Invariance: element-wise per (token, head, pair); the angle is fl32(pos * inv_freq[i]) and its
// cosine and sine are taken in fp64 and rounded once, so a token's result depends on its own
// position alone.
#ifndef SPECD_KERNELS_CUDA_ROPE_H_
#define SPECD_KERNELS_CUDA_ROPE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// A negative position is reported through ctx.error and leaves that token unrotated.
// n_tokens == 0 is a no-op.
absl::Status LaunchRope(const RopeArgs& args, const CudaContext& ctx, cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_ROPE_H_
