#include "kernels/cuda/matmul.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunkElems = 8;

__device__ __forceinline__ void Bf16x2(uint32_t word, float* out) {
  out[0] = __uint_as_float(word << 16);
  out[1] = __uint_as_float(word & 0xffff0000u);
}
__device__ __forceinline__ void F16x2(uint32_t word, float* out) {
  const __half2 h = *reinterpret_cast<const __half2*>(&word);
  const float2 f = __half22float2(h);
  out[0] = f.x;
  out[1] = f.y;
}

// Elements [i, i + 8) of a weight buffer as f32; `vec` when i * size is 16-byte aligned.
template <DType D>
__device__ __forceinline__ void LoadWeight8(const void* w, int64_t i, bool vec, float* out) {
  if (vec) {
    if constexpr (D == DType::kF32) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(w) + i));
      const float4 b = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(w) + i + 4));
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + i));
      if constexpr (D == DType::kBF16) {
        Bf16x2(v.x, out), Bf16x2(v.y, out + 2), Bf16x2(v.z, out + 4), Bf16x2(v.w, out + 6);
      } else {
        F16x2(v.x, out), F16x2(v.y, out + 2), F16x2(v.z, out + 4), F16x2(v.w, out + 6);
      }
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kChunkElems; ++e) out[e] = LoadAsF32<D>(w, i + e);
}

__device__ __forceinline__ void LoadX8(const float* x, int64_t i, bool vec, float* out) {
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + i));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + i + 4));
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    return;
  }
#pragma unroll
  for (int e = 0; e < kChunkElems; ++e) out[e] = __ldg(x + i + e);
}

// A warp computes TW tokens x RW rows; a block has kWarps warps on consecutive row groups and the
// same tokens. See matmul.h for the one reduction order every (TW, RW) follows.
template <DType D, int TW, int RW>
__global__ void __launch_bounds__(kThreads)
    MatmulKernel(const float* __restrict__ x, const void* __restrict__ w, float* __restrict__ y,
                 int64_t n_tokens, int64_t rows, int64_t cols, bool vec) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t row0 = (int64_t{blockIdx.x} * kWarps + warp) * RW;
  const int64_t t0 = int64_t{blockIdx.y} * TW;
  if (row0 >= rows) return;  // no block-wide barrier below
  const int nt = static_cast<int>(min(static_cast<int64_t>(TW), n_tokens - t0));
  int64_t wbase[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) wbase[r] = min(row0 + r, rows - 1) * cols;
  float acc[TW][RW];
#pragma unroll
  for (int t = 0; t < TW; ++t) {
#pragma unroll
    for (int r = 0; r < RW; ++r) acc[t][r] = 0.0f;
  }
  const int64_t nfull = cols / kChunkElems;
#pragma unroll 2
  for (int64_t c = lane; c < nfull; c += kWarp) {
    float wv[RW][kChunkElems];
#pragma unroll
    for (int r = 0; r < RW; ++r) LoadWeight8<D>(w, wbase[r] + c * kChunkElems, vec, wv[r]);
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      if (t < nt) {
        float xv[kChunkElems];
        LoadX8(x + (t0 + t) * cols, c * kChunkElems, vec, xv);
#pragma unroll
        for (int r = 0; r < RW; ++r) {
#pragma unroll
          for (int e = 0; e < kChunkElems; ++e) acc[t][r] = fmaf(xv[e], wv[r][e], acc[t][r]);
        }
      }
    }
  }
  // The last, partial chunk belongs to the lane whose turn its index is, after its full chunks.
  if (cols % kChunkElems != 0 && lane == nfull % kWarp) {
    for (int64_t i = nfull * kChunkElems; i < cols; ++i) {
      float wv[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) wv[r] = LoadAsF32<D>(w, wbase[r] + i);
#pragma unroll
      for (int t = 0; t < TW; ++t) {
        if (t < nt) {
          const float xv = __ldg(x + (t0 + t) * cols + i);
#pragma unroll
          for (int r = 0; r < RW; ++r) acc[t][r] = fmaf(xv, wv[r], acc[t][r]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TW; ++t) {
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const float sum = WarpSum(acc[t][r]);
      if (lane == 0 && t < nt && row0 + r < rows) y[(t0 + t) * rows + row0 + r] = sum;
    }
  }
}

template <DType D, int TW, int RW>
cudaError_t Launch(const MatmulArgs& a, bool vec, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(DivUp(a.w.rows, int64_t{kWarps} * RW)),
                  static_cast<unsigned>(DivUp(a.n_tokens, TW)));
  MatmulKernel<D, TW, RW>
      <<<grid, kThreads, 0, stream>>>(a.x, a.w.data, a.y, a.n_tokens, a.w.rows, a.w.cols, vec);
  return cudaGetLastError();
}

// `sm_count`: a one-token product of few rows (a decode step's k and v projections) takes one row
// per warp when two would leave SMs without a block.
template <DType D>
cudaError_t LaunchTyped(const MatmulArgs& a, bool vec, int tw, int sm_count, cudaStream_t stream) {
  switch (tw) {
    case 1:
      if (DivUp(a.w.rows, int64_t{kWarps} * 2) < sm_count) return Launch<D, 1, 1>(a, vec, stream);
      return Launch<D, 1, 2>(a, vec, stream);
    case 2:
      return Launch<D, 2, 2>(a, vec, stream);
    case 4:
      return Launch<D, 4, 2>(a, vec, stream);
    default:
      return Launch<D, 8, 4>(a, vec, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status LaunchMatmul(const MatmulArgs& a, const CudaContext& ctx, cudaStream_t stream,
                          int tokens_per_warp) {
  SPECD_RETURN_IF_ERROR(ValidateMatmulArgs(a));
  if (a.n_tokens == 0) return absl::OkStatus();
  // This back end's own choices and limits: the tile shape, and the grid's dimensions.
  int tw = tokens_per_warp;
  if (tw == 0) tw = a.n_tokens == 1 ? 1 : a.n_tokens == 2 ? 2 : a.n_tokens <= 4 ? 4 : 8;
  if (tw != 1 && tw != 2 && tw != 4 && tw != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("Matmul: tokens_per_warp must be 0, 1, 2, 4 or 8, got ", tokens_per_warp));
  }
  if (DivUp(a.n_tokens, tw) > 65535 || DivUp(a.w.rows, kWarps) > 0x7fffffff) {
    return absl::InvalidArgumentError("Matmul: too many tokens or rows for one launch");
  }
  // Vector loads need every row (and chunk) 16-byte aligned: cols % 8 == 0 and aligned bases.
  const bool vec = a.w.cols % kChunkElems == 0 && Aligned16(a.w.data) && Aligned16(a.x);
  cudaError_t e = cudaSuccess;
  switch (a.w.dtype) {
    case DType::kF32:
      e = LaunchTyped<DType::kF32>(a, vec, tw, ctx.sm_count, stream);
      break;
    case DType::kBF16:
      e = LaunchTyped<DType::kBF16>(a, vec, tw, ctx.sm_count, stream);
      break;
    case DType::kF16:
      e = LaunchTyped<DType::kF16>(a, vec, tw, ctx.sm_count, stream);
      break;
  }
  return CudaStatus(e, "Matmul launch");
}

}  // namespace specd::kernels::cuda
