// Embedding lookup on the GPU (see EmbeddingArgs in kernels/backend.h), beside
// kernels/cpu/elementwise.h. Invariance: each output row is a widened copy of one table row.
#ifndef SPECD_KERNELS_CUDA_EMBEDDING_H_
#define SPECD_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// An id outside [0, table.rows) is reported through ctx.error (so Synchronize fails) and its
// row is written as zeros. n_tokens == 0 is a no-op.
absl::Status LaunchEmbedding(const EmbeddingArgs& args, const CudaContext& ctx,
                             cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_EMBEDDING_H_
