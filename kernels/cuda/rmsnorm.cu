#include "kernels/cuda/rmsnorm.h"

#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(const float* x, const float* weight, float* y, int64_t dim,
                              float eps) {
  AfterPreviousKernel();
  __shared__ float smem[kWarp];
  const float* row = x + blockIdx.x * dim;
  float* out = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss = fmaf(row[i], row[i], ss);
  // BlockSum's barriers also order every read of `row` before the writes below (y may be x).
  const float total = BlockSum(ss, smem);
  const float mean = __fdiv_rn(total, static_cast<float>(dim));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    out[i] = __fmul_rn(__fmul_rn(row[i], r), weight[i]);
  }
}

}  // namespace

absl::Status LaunchRmsNorm(const RmsNormArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateRmsNormArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  // This back end's own limit: one block per token, in a grid's x dimension.
  if (a.n_tokens > 0x7fffffff) return absl::InvalidArgumentError("RmsNorm: n_tokens too large");
  LaunchKernel(RmsNormKernel, static_cast<unsigned>(a.n_tokens), kThreads, 0, stream,
               ctx.programmatic_launch, a.x, a.weight, a.y, a.dim, a.eps);
  return CudaStatus(cudaGetLastError(), "RmsNorm launch");
}

}  // namespace specd::kernels::cuda
