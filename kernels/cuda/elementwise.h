// Row-wise ops with no reduction on the GPU: SwiGLU and the row gather (see
// the Args structs in kernels/backend.h), beside kernels/cpu/elementwise.h. Invariance: each
// output element depends only on its own inputs, with each operation rounded once.
#ifndef SPECD_KERNELS_CUDA_ELEMENTWISE_H_
#define SPECD_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// out = fl(fl(gate / fl(1 + expf(-gate))) * up); out may alias gate.
absl::Status LaunchSwiGlu(const SwiGluArgs& args, const CudaContext& ctx, cudaStream_t stream);
// A row index outside [0, n_src) is reported through ctx.error and gives a row of zeros.
absl::Status LaunchGatherRows(const GatherRowsArgs& args, const CudaContext& ctx,
                              cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_ELEMENTWISE_H_
