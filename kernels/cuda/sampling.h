// The rest of the per-token math on the GPU, beside kernels/cpu/sampling.h: inverse-CDF draws
// (SampleRows), probability lookups (GatherProbs), classifier-free guidance (CombineLogits) and
// log-probabilities (Logprobs). See the Args structs in kernels/backend.h.
//
// SampleRows: one 256-thread block per draw. The uniform is Philox4x32-10 keyed as
// base/philox.h, made from two words as UniformFromWords. The prefix sums C_i are fp64 in id
// order, cut at fixed positions: thread t sums its contiguous segment sequentially, segment
// offsets are summed sequentially in segment order, and C_i = fl(offset + partial). A
// zero-probability entry leaves C unchanged and C never decreases, so, as on the CPU, a
// zero-probability token is never drawn; the draw is the smallest i with u * C_last < C_i. The
// CPU sums the whole row sequentially, so a draw can differ from the CPU's only when u * C_last
// falls within rounding of some C_i. Invariance: every draw depends on its row and counter only.
// Logprobs: per row, the fp64 sum of exp(w - m) in this back end's fixed order, then the CPU's
// formula; top tokens by (logprob desc, id asc).
#ifndef SPECD_KERNELS_CUDA_SAMPLING_H_
#define SPECD_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// Indices outside their ranges (rows, slots, tokens) are reported through ctx.error. On the GPU
// CombineLogits cannot check that row pairs are disjoint (they are in device memory): that stays
// the caller's contract. Each n == 0 is a no-op.
absl::Status LaunchCombineLogits(const CombineLogitsArgs& args, const CudaContext& ctx,
                                 cudaStream_t stream);
absl::Status LaunchSampleRows(const SampleRowsArgs& args, const CudaContext& ctx,
                              cudaStream_t stream);
absl::Status LaunchGatherProbs(const GatherProbsArgs& args, const CudaContext& ctx,
                               cudaStream_t stream);
// Uses 16 bytes of ctx.workspace per row.
absl::Status LaunchLogprobs(const LogprobsArgs& args, const CudaContext& ctx, cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_SAMPLING_H_
