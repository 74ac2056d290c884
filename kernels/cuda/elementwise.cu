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
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const float g = gate[i];
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    out[i] = __fmul_rn(silu, up[i]);
  }
}

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    y[i] = __fadd_rn(y[i], x[i]);
  }
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, float* dst, int64_t n_src,
                                 int64_t dim, DeviceError* error) {
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
  (void)ctx;
  constexpr absl::string_view kOp = "SwiGlu";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", a.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", a.dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x dim", a.n_tokens, a.dim));
  if (a.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "gate", a.gate));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "up", a.up));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "out", a.out));
  const int64_t n = a.n_tokens * a.dim;
  SwiGluKernel<<<Blocks(n), kThreads, 0, stream>>>(a.gate, a.up, a.out, n);
  return CudaStatus(cudaGetLastError(), "SwiGlu launch");
}

absl::Status LaunchAdd(const AddArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  (void)ctx;
  constexpr absl::string_view kOp = "Add";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", a.n));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", a.dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n x dim", a.n, a.dim));
  if (a.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "y", a.y));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x", a.x));
  const int64_t n = a.n * a.dim;
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(a.y, a.x, n);
  return CudaStatus(cudaGetLastError(), "Add launch");
}

absl::Status LaunchGatherRows(const GatherRowsArgs& a, const CudaContext& ctx,
                              cudaStream_t stream) {
  constexpr absl::string_view kOp = "GatherRows";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", a.n));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_src", a.n_src));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", a.dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n x dim", a.n, a.dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_src x dim", a.n_src, a.dim));
  if (a.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "src", a.src));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "rows", a.rows));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "dst", a.dst));
  SPECD_RETURN_IF_ERROR(
      CheckNoOverlap(kOp, "dst", a.dst, a.n * a.dim * 4, "src", a.src, a.n_src * a.dim * 4));
  if (a.n > 0x7fffffff) return absl::InvalidArgumentError("GatherRows: n too large");
  GatherRowsKernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a.src, a.rows, a.dst,
                                                                        a.n_src, a.dim, ctx.error);
  return CudaStatus(cudaGetLastError(), "GatherRows launch");
}

}  // namespace specd::kernels::cuda
