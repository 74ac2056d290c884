#include "kernels/cuda/rmsnorm.h"

#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(const float* x, const float* weight, float* y, int64_t dim,
                              float eps) {
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
  (void)ctx;
  constexpr absl::string_view kOp = "RmsNorm";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", a.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", a.dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x dim", a.n_tokens, a.dim));
  if (a.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x", a.x));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "weight", a.weight));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "y", a.y));
  if (!(a.eps >= 0.0f)) return absl::InvalidArgumentError("RmsNorm: eps must be >= 0");
  if (a.n_tokens > 0x7fffffff) return absl::InvalidArgumentError("RmsNorm: n_tokens too large");
  RmsNormKernel<<<static_cast<unsigned>(a.n_tokens), kThreads, 0, stream>>>(a.x, a.weight, a.y,
                                                                            a.dim, a.eps);
  return CudaStatus(cudaGetLastError(), "RmsNorm launch");
}

}  // namespace specd::kernels::cuda
