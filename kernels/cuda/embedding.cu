#include "kernels/cuda/embedding.h"

#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

template <DType D>
__global__ void EmbeddingKernel(const void* table, int64_t rows, int64_t dim, const int32_t* ids,
                                float* out, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* dst = out + t * dim;
  if (id < 0 || id >= rows) {
    if (threadIdx.x == 0) ReportError(error, DeviceOp::kEmbedding, DeviceField::kIds, t, id);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = 0.0f;
    return;
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    dst[i] = LoadAsF32<D>(table, id * dim + i);
}

}  // namespace

absl::Status LaunchEmbedding(const EmbeddingArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateEmbeddingArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  // This back end's own limit (one block per token, in a grid's x dimension). The ids are device
  // memory: the kernel checks them and Synchronize reports them.
  if (a.n_tokens > 0x7fffffff) return absl::InvalidArgumentError("Embedding: n_tokens too large");
  const dim3 grid(static_cast<unsigned>(a.n_tokens));
  switch (a.table.dtype) {
    case DType::kF32:
      LaunchKernel(EmbeddingKernel<DType::kF32>, grid, 256, 0, stream, ctx.programmatic_launch,
                   a.table.data, a.table.rows, a.table.cols, a.ids, a.out, ctx.error);
      break;
    case DType::kBF16:
      LaunchKernel(EmbeddingKernel<DType::kBF16>, grid, 256, 0, stream, ctx.programmatic_launch,
                   a.table.data, a.table.rows, a.table.cols, a.ids, a.out, ctx.error);
      break;
    case DType::kF16:
      LaunchKernel(EmbeddingKernel<DType::kF16>, grid, 256, 0, stream, ctx.programmatic_launch,
                   a.table.data, a.table.rows, a.table.cols, a.ids, a.out, ctx.error);
      break;
  }
  return CudaStatus(cudaGetLastError(), "Embedding launch");
}

}  // namespace specd::kernels::cuda
