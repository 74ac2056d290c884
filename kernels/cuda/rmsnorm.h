// RMSNorm on the GPU (see RmsNormArgs in kernels/backend.h), beside kernels/cpu/rmsnorm.h.
// Invariance: one block per row; each thread sums the squares of a fixed strided set of
// elements in order, then a fixed tree combines the threads (RowInvRms in device_common.cuh), so
// a row's bits depend on the row alone. MatmulGroup's input_norm computes the same bits.
#ifndef SPECD_KERNELS_CUDA_RMSNORM_H_
#define SPECD_KERNELS_CUDA_RMSNORM_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// y may alias x. n_tokens == 0 is a no-op.
absl::Status LaunchRmsNorm(const RmsNormArgs& args, const CudaContext& ctx, cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_RMSNORM_H_
