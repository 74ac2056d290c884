#include "kernels/cuda/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kCopySmemBytes = 48 * 1024;

__global__ void StoreKvKernel(const float* k, const float* v, PagedKv c, const int32_t* token_seq,
                              const int32_t* slot, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t t = blockIdx.x;
  __shared__ int64_t offset;
  if (threadIdx.x == 0) offset = RowOffset(c, token_seq, slot, t, DeviceOp::kStoreKv, error);
  __syncthreads();
  if (offset < 0) return;
  const float* kr = k + t * c.kv_dim;
  const float* vr = v + t * c.kv_dim;
  for (int64_t i = threadIdx.x; i < c.kv_dim; i += kThreads) {
    StoreKvElement(c.k, c.dtype, offset + i, kr[i]);
    StoreKvElement(c.v, c.dtype, offset + i, vr[i]);
  }
}

// Block (layer * 2 + tensor, column tile): element type T (the cache's bits).
template <typename T>
__global__ void CopyKvRowsKernel(void* k, void* v, int64_t layer_stride, int64_t kv_dim,
                                 const int32_t* src_rows, const int32_t* dst_rows, int64_t n,
                                 int64_t tile, DeviceError* error) {
  AfterPreviousKernel();
  extern __shared__ unsigned char smem_raw[];
  T* saved = reinterpret_cast<T*>(smem_raw);  // [n][tile]
  const int64_t layer = blockIdx.x / 2;
  T* base = static_cast<T*>(blockIdx.x % 2 == 0 ? k : v) + layer * layer_stride * kv_dim;
  const int64_t col0 = blockIdx.y * tile;
  const int64_t cols = min(tile, kv_dim - col0);
  const bool report = blockIdx.x == 0 && blockIdx.y == 0;
  for (int64_t e = threadIdx.x; e < n * cols; e += kThreads) {
    const int64_t i = e / cols;
    const int32_t s = src_rows[i];
    const int32_t d = dst_rows[i];
    if (s < 0 || s >= layer_stride || d < 0 || d >= layer_stride) continue;
    saved[i * tile + e % cols] = base[int64_t{s} * kv_dim + col0 + e % cols];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < n * cols; e += kThreads) {
    const int64_t i = e / cols;
    const int32_t s = src_rows[i];
    const int32_t d = dst_rows[i];
    if (s < 0 || s >= layer_stride) {
      if (report && e % cols == 0)
        ReportError(error, DeviceOp::kCopyKvRows, DeviceField::kSrcRows, i, s);
      continue;
    }
    if (d < 0 || d >= layer_stride) {
      if (report && e % cols == 0)
        ReportError(error, DeviceOp::kCopyKvRows, DeviceField::kDstRows, i, d);
      continue;
    }
    base[int64_t{d} * kv_dim + col0 + e % cols] = saved[i * tile + e % cols];
  }
}

}  // namespace

absl::Status LaunchStoreKv(const StoreKvArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateStoreKvArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  // This back end's own limit (one block per token, in a grid's x dimension). Sequences, slots
  // and the block table are device memory: the kernel checks them and Synchronize reports them.
  if (a.n_tokens > 0x7fffffff) return absl::InvalidArgumentError("StoreKv: n_tokens too large");
  LaunchKernel(StoreKvKernel, static_cast<unsigned>(a.n_tokens), kThreads, 0, stream,
               ctx.programmatic_launch, a.k, a.v, a.cache, a.token_seq, a.slot, ctx.error);
  return CudaStatus(cudaGetLastError(), "StoreKv launch");
}

absl::Status LaunchCopyKvRows(const CopyKvRowsArgs& a, const CudaContext& ctx,
                              cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateCopyKvRowsArgs(a));
  if (a.n == 0) return absl::OkStatus();
  // This back end's own limits: the rows of one column tile must fit in shared memory, and the
  // grid's dimensions. The row indices are device memory: the kernel checks them and Synchronize
  // reports them.
  const int64_t elem = DTypeSize(a.dtype);
  if (a.n > kMaxCopyKvRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyKvRows: n = ", a.n,
                     " rows in one call; the CUDA back end copies at most ", kMaxCopyKvRows));
  }
  const int64_t tile = std::clamp<int64_t>(kCopySmemBytes / (a.n * elem), 1, a.kv_dim);
  const int64_t tiles = DivUp(a.kv_dim, tile);
  if (a.n_layers * 2 > 0x7fffffff || tiles > 65535) {
    return absl::InvalidArgumentError("CopyKvRows: too many layers or columns");
  }
  const dim3 grid(static_cast<unsigned>(a.n_layers * 2), static_cast<unsigned>(tiles));
  const size_t smem = static_cast<size_t>(a.n * tile * elem);
  if (elem == 4) {
    LaunchKernel(CopyKvRowsKernel<uint32_t>, grid, kThreads, smem, stream, ctx.programmatic_launch,
                 a.k, a.v, a.layer_stride, a.kv_dim, a.src_rows, a.dst_rows, a.n, tile, ctx.error);
  } else {
    LaunchKernel(CopyKvRowsKernel<uint16_t>, grid, kThreads, smem, stream, ctx.programmatic_launch,
                 a.k, a.v, a.layer_stride, a.kv_dim, a.src_rows, a.dst_rows, a.n, tile, ctx.error);
  }
  return CudaStatus(cudaGetLastError(), "CopyKvRows launch");
}

}  // namespace specd::kernels::cuda
