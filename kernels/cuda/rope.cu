#include "kernels/cuda/rope.h"

#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 128;

// Heads [0, n_heads) of x, then [0, n_heads2) of x2, as one range of heads. With kStore, the
// token's rotated x2 (its keys) and v also go to its cache row: StoreKv's work, in this launch.
template <bool kStore>
__global__ void RopeKernel(float* x, int64_t n_heads, float* x2, int64_t n_heads2,
                           const int32_t* pos, const float* inv_freq, int64_t head_dim,
                           StoreKvArgs store, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t t = blockIdx.x;
  const int32_t p = pos[t];
  // The cache row, found before any thread returns (the barrier needs them all).
  __shared__ int64_t offset;
  if constexpr (kStore) {
    if (threadIdx.x == 0) {
      offset = RowOffset(store.cache, store.token_seq, store.slot, t, DeviceOp::kStoreKv, error);
    }
    __syncthreads();
  }
  if (p < 0) {
    if (threadIdx.x == 0) ReportError(error, DeviceOp::kRope, DeviceField::kPos, t, p);
    return;
  }
  const int64_t half = head_dim / 2;
  float* row = x + t * n_heads * head_dim;
  float* row2 = x2 + t * n_heads2 * head_dim;
  for (int64_t k = threadIdx.x; k < (n_heads + n_heads2) * half; k += kThreads) {
    const int64_t h = k / half;
    const int64_t i = k % half;
    const float angle = __fmul_rn(static_cast<float>(p), inv_freq[i]);
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    const float cf = static_cast<float>(c);
    const float sf = static_cast<float>(s);
    float* a = h < n_heads ? row + h * head_dim + i : row2 + (h - n_heads) * head_dim + i;
    float* b = a + half;
    const float xa = *a;
    const float xb = *b;
    const float ra = __fsub_rn(__fmul_rn(xa, cf), __fmul_rn(xb, sf));
    const float rb = __fadd_rn(__fmul_rn(xb, cf), __fmul_rn(xa, sf));
    *a = ra;
    *b = rb;
    if constexpr (kStore) {
      if (h >= n_heads && offset >= 0) {
        const int64_t at = offset + (h - n_heads) * head_dim + i;
        StoreKvElement(store.cache.k, store.cache.dtype, at, ra);
        StoreKvElement(store.cache.k, store.cache.dtype, at + half, rb);
      }
    }
  }
  if constexpr (kStore) {
    if (offset < 0) return;
    const float* vr = store.v + t * store.cache.kv_dim;
    for (int64_t i = threadIdx.x; i < store.cache.kv_dim; i += kThreads) {
      StoreKvElement(store.cache.v, store.cache.dtype, offset + i, vr[i]);
    }
  }
}

}  // namespace

absl::Status LaunchRope(const RopeArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateRopeArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  // This back end's own limit (one block per token, in a grid's x dimension). The positions (and
  // a store's sequences, slots and block table) are device memory: the kernel checks them and
  // Synchronize reports them.
  if (a.n_tokens > 0x7fffffff) return absl::InvalidArgumentError("Rope: n_tokens too large");
  const unsigned blocks = static_cast<unsigned>(a.n_tokens);
  if (a.store.has_value()) {
    LaunchKernel(RopeKernel<true>, blocks, kThreads, 0, stream, ctx.programmatic_launch, a.x,
                 a.n_heads, a.x2, a.n_heads2, a.pos, a.inv_freq, a.head_dim, *a.store, ctx.error);
  } else {
    LaunchKernel(RopeKernel<false>, blocks, kThreads, 0, stream, ctx.programmatic_launch, a.x,
                 a.n_heads, a.x2, a.n_heads2, a.pos, a.inv_freq, a.head_dim, StoreKvArgs{},
                 ctx.error);
  }
  return CudaStatus(cudaGetLastError(), "Rope launch");
}

}  // namespace specd::kernels::cuda
