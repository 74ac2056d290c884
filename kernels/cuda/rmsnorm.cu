#include "kernels/cuda/rmsnorm.h"

#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const float* x, const float* weight, float* y, int64_t dim, float eps) {
  AfterPreviousKernel();
  __shared__ float smem[kWarp];
  const float* row = x + blockIdx.x * dim;
  float* out = y + blockIdx.x * dim;
  // RowInvRms's barriers also order every read of `row` before the writes below (y may be x).
  const float r = RowInvRms(row, dim, eps, smem);
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) out[i] = Normed(row[i], r, weight[i]);
}

}  // namespace

absl::Status LaunchRmsNorm(const RmsNormArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateRmsNormArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  // This back end's own limit: one block per token, in a grid's x dimension.
  if (a.n_tokens > 0x7fffffff) return absl::InvalidArgumentError("RmsNorm: n_tokens too large");
  LaunchKernel(RmsNormKernel, static_cast<unsigned>(a.n_tokens), kNormThreads, 0, stream,
               ctx.programmatic_launch, a.x, a.weight, a.y, a.dim, a.eps);
  return CudaStatus(cudaGetLastError(), "RmsNorm launch");
}

}  // namespace specd::kernels::cuda
