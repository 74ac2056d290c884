#include "kernels/cuda/matmul.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rmsnorm.h"
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

// The parts of one launch (a group of one for a plain Matmul): x, n_tokens and cols are shared;
// part p owns the blocks [block_end[p - 1], block_end[p]) of the grid's x dimension.
struct Parts {
  const void* w[kMaxMatmulGroup];
  float* y[kMaxMatmulGroup];
  int64_t rows[kMaxMatmulGroup];
  unsigned block_end[kMaxMatmulGroup];
  bool accumulate[kMaxMatmulGroup];
  int n_parts;
  const float* norm;  // MatmulGroupArgs::input_norm's weight, or null
  float eps;
};

// A warp computes TW tokens x RW rows of one part; a block has kWarps warps on consecutive row
// groups of that part and the same tokens. See matmul.h for the one reduction order every
// (TW, RW) follows. With kSwiGlu the grid covers the gate's rows only, and a warp computes its RW
// rows of the gate AND of up (parts 0 and 1), so it writes silu(gate) * up without storing up.
// With parts.norm, the block first finds its tokens' 1/rms as RmsNorm does, and normalizes x as
// it loads it, with RmsNorm's bits.
template <DType D, int TW, int RW, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads)
    MatmulKernel(const float* __restrict__ x, const Parts parts, int64_t n_tokens, int64_t cols,
                 bool vec) {
  AfterPreviousKernel();
  constexpr int kMats = kSwiGlu ? 2 : 1;  // weight matrices a warp reads
  // Constant indices only, so the parts stay in the parameter space (no local-memory copy).
  const void* __restrict__ w = parts.w[0];
  const void* __restrict__ w_up = parts.w[1];
  float* __restrict__ y = parts.y[0];
  int64_t rows = parts.rows[0];
  bool accumulate = parts.accumulate[0];
  unsigned block = blockIdx.x;
  if constexpr (!kSwiGlu) {
#pragma unroll
    for (int i = 1; i < kMaxMatmulGroup; ++i) {
      if (i < parts.n_parts && blockIdx.x >= parts.block_end[i - 1]) {
        w = parts.w[i];
        y = parts.y[i];
        rows = parts.rows[i];
        accumulate = parts.accumulate[i];
        block = blockIdx.x - parts.block_end[i - 1];
      }
    }
  }
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t row0 = (int64_t{block} * kWarps + warp) * RW;
  const int64_t t0 = int64_t{blockIdx.y} * TW;
  const int nt = static_cast<int>(min(static_cast<int64_t>(TW), n_tokens - t0));
  const float* __restrict__ norm = parts.norm;
  __shared__ float inv_rms[TW];
  if (norm != nullptr) {
    __shared__ float smem[kWarp];
    static_assert(kThreads == kNormThreads, "the norm's reduction order is RmsNorm's");
    for (int t = 0; t < nt; ++t) {
      const float r = RowInvRms(x + (t0 + t) * cols, cols, parts.eps, smem);
      if (threadIdx.x == 0) inv_rms[t] = r;
    }
    __syncthreads();
  }
  if (row0 >= rows) return;  // no block-wide barrier below
  int64_t wbase[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) wbase[r] = min(row0 + r, rows - 1) * cols;
  // Accumulator m * RW + r is row r of matrix m (the gate's rows, then up's).
  float acc[TW][kMats * RW];
#pragma unroll
  for (int t = 0; t < TW; ++t) {
#pragma unroll
    for (int r = 0; r < kMats * RW; ++r) acc[t][r] = 0.0f;
  }
  const int64_t nfull = cols / kChunkElems;
#pragma unroll 2
  for (int64_t c = lane; c < nfull; c += kWarp) {
    float gv[kChunkElems];
    if (norm != nullptr) LoadX8(norm, c * kChunkElems, vec, gv);
    float wv[kMats * RW][kChunkElems];
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        LoadWeight8<D>(m == 0 ? w : w_up, wbase[r] + c * kChunkElems, vec, wv[m * RW + r]);
      }
    }
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      if (t < nt) {
        float xv[kChunkElems];
        LoadX8(x + (t0 + t) * cols, c * kChunkElems, vec, xv);
        if (norm != nullptr) {
          const float r = inv_rms[t];
#pragma unroll
          for (int e = 0; e < kChunkElems; ++e) xv[e] = Normed(xv[e], r, gv[e]);
        }
#pragma unroll
        for (int r = 0; r < kMats * RW; ++r) {
#pragma unroll
          for (int e = 0; e < kChunkElems; ++e) acc[t][r] = fmaf(xv[e], wv[r][e], acc[t][r]);
        }
      }
    }
  }
  // The last, partial chunk belongs to the lane whose turn its index is, after its full chunks.
  if (cols % kChunkElems != 0 && lane == nfull % kWarp) {
    for (int64_t i = nfull * kChunkElems; i < cols; ++i) {
      float wv[kMats * RW];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
#pragma unroll
        for (int r = 0; r < RW; ++r) wv[m * RW + r] = LoadAsF32<D>(m == 0 ? w : w_up, wbase[r] + i);
      }
#pragma unroll
      for (int t = 0; t < TW; ++t) {
        if (t < nt) {
          float xv = __ldg(x + (t0 + t) * cols + i);
          if (norm != nullptr) xv = Normed(xv, inv_rms[t], __ldg(norm + i));
#pragma unroll
          for (int r = 0; r < kMats * RW; ++r) acc[t][r] = fmaf(xv, wv[r], acc[t][r]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TW; ++t) {
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const float sum = WarpSum(acc[t][r]);
      if constexpr (kSwiGlu) {
        const float up = WarpSum(acc[t][RW + r]);
        if (lane == 0 && t < nt && row0 + r < rows) {
          y[(t0 + t) * rows + row0 + r] = SiluMul(sum, up);
        }
      } else if (lane == 0 && t < nt && row0 + r < rows) {
        float* out = y + (t0 + t) * rows + row0 + r;
        *out = accumulate ? *out + sum : sum;
      }
    }
  }
}

template <DType D, int TW, int RW, bool kSwiGlu>
cudaError_t Launch(const MatmulGroupArgs& g, bool vec, const CudaContext& ctx,
                   cudaStream_t stream) {
  Parts parts{};
  parts.n_parts = g.n_parts;
  parts.norm = g.input_norm.weight;
  parts.eps = g.input_norm.eps;
  unsigned blocks = 0;
  for (int i = 0; i < g.n_parts; ++i) {
    const MatmulArgs& a = g.parts[static_cast<size_t>(i)];
    parts.w[i] = a.w.data;
    parts.y[i] = a.y;
    parts.rows[i] = a.w.rows;
    parts.accumulate[i] = a.accumulate;
    // The fused gate/up product's warps cover the gate's rows and read up's beside them.
    if (i == 0 || !kSwiGlu) blocks += static_cast<unsigned>(DivUp(a.w.rows, int64_t{kWarps} * RW));
    parts.block_end[i] = blocks;
  }
  const MatmulArgs& first = g.parts[0];
  const dim3 grid(blocks, static_cast<unsigned>(DivUp(first.n_tokens, TW)));
  LaunchKernel(MatmulKernel<D, TW, RW, kSwiGlu>, grid, kThreads, 0, stream, ctx.programmatic_launch,
               first.x, parts, first.n_tokens, first.w.cols, vec);
  return cudaGetLastError();
}

int64_t TotalRows(const MatmulGroupArgs& g) {
  int64_t rows = 0;
  for (int i = 0; i < g.n_parts; ++i) rows += g.parts[static_cast<size_t>(i)].w.rows;
  return rows;
}

// `ctx.sm_count`: a one-token product of few rows (a decode step's k and v projections) takes one
// row per warp when two would leave SMs without a block. The fused gate/up product keeps half the
// rows per warp, so that a warp holds as many accumulators as the plain shape does.
template <DType D>
cudaError_t LaunchTyped(const MatmulGroupArgs& g, bool vec, int tw, const CudaContext& ctx,
                        cudaStream_t stream) {
  if (g.swiglu) {
    switch (tw) {
      case 1:
        return Launch<D, 1, 1, true>(g, vec, ctx, stream);
      case 2:
        return Launch<D, 2, 1, true>(g, vec, ctx, stream);
      case 4:
        return Launch<D, 4, 1, true>(g, vec, ctx, stream);
      default:
        return Launch<D, 8, 2, true>(g, vec, ctx, stream);
    }
  }
  switch (tw) {
    case 1:
      if (DivUp(TotalRows(g), int64_t{kWarps} * 2) < ctx.sm_count) {
        return Launch<D, 1, 1, false>(g, vec, ctx, stream);
      }
      return Launch<D, 1, 2, false>(g, vec, ctx, stream);
    case 2:
      return Launch<D, 2, 2, false>(g, vec, ctx, stream);
    case 4:
      return Launch<D, 4, 2, false>(g, vec, ctx, stream);
    default:
      return Launch<D, 8, 4, false>(g, vec, ctx, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status LaunchMatmulGroup(const MatmulGroupArgs& g, const CudaContext& ctx,
                               cudaStream_t stream, int tokens_per_warp) {
  SPECD_RETURN_IF_ERROR(ValidateMatmulGroupArgs(g));
  const MatmulArgs& first = g.parts[0];
  if (first.n_tokens == 0) return absl::OkStatus();
  // This back end's own choices and limits: the tile shape, and the grid's dimensions.
  int tw = tokens_per_warp;
  if (tw == 0) tw = first.n_tokens == 1 ? 1 : first.n_tokens == 2 ? 2 : first.n_tokens <= 4 ? 4 : 8;
  if (tw != 1 && tw != 2 && tw != 4 && tw != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("Matmul: tokens_per_warp must be 0, 1, 2, 4 or 8, got ", tokens_per_warp));
  }
  if (DivUp(first.n_tokens, tw) > 65535 || DivUp(TotalRows(g), kWarps) > 0x7fffffff) {
    return absl::InvalidArgumentError("Matmul: too many tokens or rows for one launch");
  }
  bool one_dtype = true;
  for (int i = 1; i < g.n_parts; ++i) {
    one_dtype = one_dtype && g.parts[static_cast<size_t>(i)].w.dtype == first.w.dtype;
  }
  // The folded norm pays where the product is one tile of tokens (a decode or verify pass): it
  // saves RmsNorm's launch. Over more tokens every block would normalize its tile again, so
  // RmsNorm runs first, once per token, with the same bits.
  const InputNorm& norm = g.input_norm;
  if (norm.weight != nullptr && (!one_dtype || DivUp(first.n_tokens, tw) > 1)) {
    SPECD_RETURN_IF_ERROR(LaunchRmsNorm(
        {first.x, norm.weight, norm.normed, first.n_tokens, first.w.cols, norm.eps}, ctx, stream));
    MatmulGroupArgs on_normed = g;
    on_normed.input_norm = {};
    for (int i = 0; i < g.n_parts; ++i) on_normed.parts[static_cast<size_t>(i)].x = norm.normed;
    return LaunchMatmulGroup(on_normed, ctx, stream, tokens_per_warp);
  }
  // One launch covers parts of one dtype; a mixed group (never made by the engine, whose layers
  // have one dtype) runs part by part, then SwiGlu, with the same bits.
  if (!one_dtype) {
    for (int j = 0; j < g.n_parts; ++j) {
      SPECD_RETURN_IF_ERROR(
          LaunchMatmul(g.parts[static_cast<size_t>(j)], ctx, stream, tokens_per_warp));
    }
    if (!g.swiglu) return absl::OkStatus();
    return LaunchSwiGlu({first.y, g.parts[1].y, first.y, first.n_tokens, first.w.rows}, ctx,
                        stream);
  }
  // Vector loads need every row (and chunk) 16-byte aligned: cols % 8 == 0 and aligned bases.
  bool vec = first.w.cols % kChunkElems == 0 && Aligned16(first.x) &&
             (norm.weight == nullptr || Aligned16(norm.weight));
  for (int i = 0; i < g.n_parts; ++i)
    vec = vec && Aligned16(g.parts[static_cast<size_t>(i)].w.data);
  cudaError_t e = cudaSuccess;
  switch (first.w.dtype) {
    case DType::kF32:
      e = LaunchTyped<DType::kF32>(g, vec, tw, ctx, stream);
      break;
    case DType::kBF16:
      e = LaunchTyped<DType::kBF16>(g, vec, tw, ctx, stream);
      break;
    case DType::kF16:
      e = LaunchTyped<DType::kF16>(g, vec, tw, ctx, stream);
      break;
  }
  return CudaStatus(e, "Matmul launch");
}

absl::Status LaunchMatmul(const MatmulArgs& a, const CudaContext& ctx, cudaStream_t stream,
                          int tokens_per_warp) {
  SPECD_RETURN_IF_ERROR(ValidateMatmulArgs(a));
  MatmulGroupArgs g;
  g.parts[0] = a;
  g.n_parts = 1;
  return LaunchMatmulGroup(g, ctx, stream, tokens_per_warp);
}

}  // namespace specd::kernels::cuda
