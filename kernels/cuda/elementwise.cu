#include "kernels/cuda/elementwise.h"

#include <algorithm>

#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(DivUp(n, kThreads), int64_t{1} << 20));
}

__global__ void SwiGluKernel(const float* gate, const float* up, float* out, int64_t n) {
  AfterPreviousKernel();
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    out[i] = SiluMul(gate[i], up[i]);
  }
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, float* dst, int64_t n_src,
                                 int64_t dim, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  float* out = dst + i * dim;
  if (r < 0 || r >= n_src) {
    if (threadIdx.x == 0) ReportError(error, DeviceOp::kGatherRows, DeviceField::kRows, i, r);
    for (int64_t k = threadIdx.x; k < dim; k += kThreads) out[k] = 0.0f;
    return;
  }
  const float* in = src + r * dim;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads) out[k] = in[k];
}

}  // namespace

absl::Status LaunchSwiGlu(const SwiGluArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateSwiGluArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  const int64_t n = a.n_tokens * a.dim;
  LaunchKernel(SwiGluKernel, Blocks(n), kThreads, 0, stream, ctx.programmatic_launch, a.gate, a.up,
               a.out, n);
  return CudaStatus(cudaGetLastError(), "SwiGlu launch");
}

absl::Status LaunchGatherRows(const GatherRowsArgs& a, const CudaContext& ctx,
                              cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateGatherRowsArgs(a));
  if (a.n == 0) return absl::OkStatus();
  // This back end's own limit (one block per row, in a grid's x dimension). The row indices are
  // device memory: the kernel checks them and Synchronize reports them.
  if (a.n > 0x7fffffff) return absl::InvalidArgumentError("GatherRows: n too large");
  LaunchKernel(GatherRowsKernel, static_cast<unsigned>(a.n), kThreads, 0, stream,
               ctx.programmatic_launch, a.src, a.rows, a.dst, a.n_src, a.dim, ctx.error);
  return CudaStatus(cudaGetLastError(), "GatherRows launch");
}

}  // namespace specd::kernels::cuda
