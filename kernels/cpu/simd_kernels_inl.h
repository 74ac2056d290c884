// Loop nests shared by the per-ISA units (simd_*.cc), written once against a 16-lane vector
// type `V` that each unit defines in its own anonymous namespace. Everything here is in an
// anonymous namespace too, so every instantiation is private to its unit (see simd.h for why).
// Include only from simd_*.cc.
//
// V provides: Vec; Zero(); LoadF32/LoadF16/LoadBf16(p) of 16 elements; the same with a Tail
// suffix taking (p, n) with 0 < n < 16 and zero-filling lanes >= n; Fma(a, b, c) = a * b + c
// rounded once per lane; Reduce(v) with the tree of simd.h; Set1(f); StoreF32(p, v) and
// StoreF32Tail(p, v, n) writing lanes < n only; Prefetch(p), a hint that may do nothing. And the
// matmul tiling, which never changes results, only speed:
//   kRows          weight rows per tile;
//   kMatvecRows    weight rows per tile when there is a single token (a matvec);
//   kMaxTokens     tokens per tile;
//   kTokenBlock    tokens whose x rows stay in cache while a thread's weight rows go by;
//   kPrefetchBytes how far ahead of the weight loads to prefetch with several tokens (0: never;
//                  a matvec is left to the hardware prefetchers).
#ifndef SPECD_KERNELS_CPU_SIMD_KERNELS_INL_H_
#define SPECD_KERNELS_CPU_SIMD_KERNELS_INL_H_

#include <cstdint>

#include "kernels/cpu/simd.h"

#define SPECD_UNROLL _Pragma("GCC unroll 16")

namespace specd::kernels::cpu {
namespace {

template <WeightType W>
struct WeightElem {
  using type = uint16_t;
};
template <>
struct WeightElem<WeightType::kF32> {
  using type = float;
};

template <class V, WeightType W>
inline typename V::Vec LoadW(const typename WeightElem<W>::type* p) {
  if constexpr (W == WeightType::kF32) {
    return V::LoadF32(p);
  } else if constexpr (W == WeightType::kF16) {
    return V::LoadF16(p);
  } else {
    return V::LoadBf16(p);
  }
}

template <class V, WeightType W>
inline typename V::Vec LoadWTail(const typename WeightElem<W>::type* p, int n) {
  if constexpr (W == WeightType::kF32) {
    return V::LoadF32Tail(p, n);
  } else if constexpr (W == WeightType::kF16) {
    return V::LoadF16Tail(p, n);
  } else {
    return V::LoadBf16Tail(p, n);
  }
}

// The canonical dot product of simd.h.
template <class V>
float Dot(const float* a, const float* b, int64_t n) {
  typename V::Vec acc = V::Zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = V::Fma(V::LoadF32(a + i), V::LoadF32(b + i), acc);
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    acc = V::Fma(V::LoadF32Tail(a + i, rest), V::LoadF32Tail(b + i, rest), acc);
  }
  return V::Reduce(acc);
}

// Dot() of `a` with `rows` rows of `b`, four at a time for instruction-level parallelism.
template <class V>
void DotRows(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n, float* out) {
  using Vec = typename V::Vec;
  constexpr int kBlock = 4;
  int64_t r = 0;
  for (; r + kBlock <= rows; r += kBlock) {
    Vec acc[kBlock];
    SPECD_UNROLL for (int k = 0; k < kBlock; ++k) acc[k] = V::Zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const Vec av = V::LoadF32(a + i);
      SPECD_UNROLL for (int k = 0; k < kBlock; ++k) {
        acc[k] = V::Fma(av, V::LoadF32(b + (r + k) * stride + i), acc[k]);
      }
    }
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      const Vec av = V::LoadF32Tail(a + i, rest);
      SPECD_UNROLL for (int k = 0; k < kBlock; ++k) {
        acc[k] = V::Fma(av, V::LoadF32Tail(b + (r + k) * stride + i, rest), acc[k]);
      }
    }
    SPECD_UNROLL for (int k = 0; k < kBlock; ++k) out[r + k] = V::Reduce(acc[k]);
  }
  for (; r < rows; ++r) out[r] = Dot<V>(a, b + r * stride, n);
}

// Columns [col, col + 16 * C) of AxpyRows, C chunks held in registers across all rows.
template <class V, int C>
void AxpyRowsChunks(const float* w, const float* x, int64_t stride, int64_t rows, int64_t col,
                    float* y) {
  using Vec = typename V::Vec;
  Vec acc[C];
  SPECD_UNROLL for (int k = 0; k < C; ++k) acc[k] = V::LoadF32(y + col + 16 * k);
  for (int64_t r = 0; r < rows; ++r) {
    const Vec wv = V::Set1(w[r]);
    const float* row = x + r * stride + col;
    SPECD_UNROLL for (int k = 0; k < C; ++k) acc[k] = V::Fma(wv, V::LoadF32(row + 16 * k), acc[k]);
  }
  SPECD_UNROLL for (int k = 0; k < C; ++k) V::StoreF32(y + col + 16 * k, acc[k]);
}

template <class V>
void AxpyRows(const float* w, const float* x, int64_t stride, int64_t rows, int64_t n, float* y) {
  using Vec = typename V::Vec;
  int64_t col = 0;
  for (; col + 64 <= n; col += 64) AxpyRowsChunks<V, 4>(w, x, stride, rows, col, y);
  for (; col + 16 <= n; col += 16) AxpyRowsChunks<V, 1>(w, x, stride, rows, col, y);
  if (col < n) {
    const int rest = static_cast<int>(n - col);
    Vec acc = V::LoadF32Tail(y + col, rest);
    for (int64_t r = 0; r < rows; ++r) {
      acc = V::Fma(V::Set1(w[r]), V::LoadF32Tail(x + r * stride + col, rest), acc);
    }
    V::StoreF32Tail(y + col, acc, rest);
  }
}

// How far ahead of the weights being read to prefetch: kPrefetchBytes, or one tile of kRows rows
// if that is longer.
template <class V, WeightType W>
int64_t PrefetchDistance(const MatmulTask& task) {
  const int64_t tile =
      V::kRows * task.cols * static_cast<int64_t>(sizeof(typename WeightElem<W>::type));
  return tile > V::kPrefetchBytes ? tile : V::kPrefetchBytes;
}

// R weight rows x T tokens: each weight chunk is loaded (and converted) once for T tokens, and
// every (token, row) pair has its own accumulator, updated in the same order as Dot().
template <class V, WeightType W, int R, int T, bool kPrefetch>
void MatmulTile(const MatmulTask& task, int64_t row, int64_t tok) {
  using Elem = typename WeightElem<W>::type;
  using Vec = typename V::Vec;
  const int64_t cols = task.cols;
  const Elem* w[R];
  SPECD_UNROLL for (int r = 0; r < R; ++r) {
    w[r] = static_cast<const Elem*>(task.w) + (row + r) * cols;
  }
  const float* x[T];
  SPECD_UNROLL for (int t = 0; t < T; ++t) x[t] = task.x + (tok + t) * cols;
  Vec acc[T][R];
  SPECD_UNROLL for (int t = 0; t < T; ++t) {
    SPECD_UNROLL for (int r = 0; r < R; ++r) acc[t][r] = V::Zero();
  }
  // The tile's R rows are one contiguous block that the loop consumes R chunks at a time.
  // Prefetching the same amount per step, PrefetchDistance() ahead of that linear position,
  // sweeps memory in one stream at the rate it is consumed: hardware prefetchers follow one
  // stream much better than R interleaved ones that each end after a row. With the distance at
  // least a tile, the previous tile's sweep has covered all of this one.
  constexpr int kStepBytes = R * 16 * static_cast<int>(sizeof(Elem));
  // An address, not a pointer: it runs past the end of the weights, where a prefetch is harmless.
  uintptr_t prefetch = reinterpret_cast<uintptr_t>(w[0]) + PrefetchDistance<V, W>(task);
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    if constexpr (kPrefetch) {
      SPECD_UNROLL for (int b = 0; b < kStepBytes; b += 64) {
        V::Prefetch(reinterpret_cast<const void*>(prefetch + b));
      }
      prefetch += kStepBytes;
    }
    Vec wv[R];
    SPECD_UNROLL for (int r = 0; r < R; ++r) wv[r] = LoadW<V, W>(w[r] + c);
    SPECD_UNROLL for (int t = 0; t < T; ++t) {
      const Vec xv = V::LoadF32(x[t] + c);
      SPECD_UNROLL for (int r = 0; r < R; ++r) acc[t][r] = V::Fma(wv[r], xv, acc[t][r]);
    }
  }
  if (c < cols) {
    const int rest = static_cast<int>(cols - c);
    Vec wv[R];
    SPECD_UNROLL for (int r = 0; r < R; ++r) wv[r] = LoadWTail<V, W>(w[r] + c, rest);
    SPECD_UNROLL for (int t = 0; t < T; ++t) {
      const Vec xv = V::LoadF32Tail(x[t] + c, rest);
      SPECD_UNROLL for (int r = 0; r < R; ++r) acc[t][r] = V::Fma(wv[r], xv, acc[t][r]);
    }
  }
  SPECD_UNROLL for (int t = 0; t < T; ++t) {
    float* y = task.y + (tok + t) * task.rows + row;
    SPECD_UNROLL for (int r = 0; r < R; ++r) {
      const float sum = V::Reduce(acc[t][r]);
      y[r] = task.accumulate ? y[r] + sum : sum;
    }
  }
}

// The last tile of a token block, with its size `rest` < kMaxT turned into a template argument.
template <class V, WeightType W, int R, int T, bool kPrefetch>
void MatmulLastTile(const MatmulTask& task, int64_t row, int64_t tok, int64_t rest) {
  if constexpr (T >= 1) {
    if (rest == T) return MatmulTile<V, W, R, T, kPrefetch>(task, row, tok);
    MatmulLastTile<V, W, R, T - 1, kPrefetch>(task, row, tok, rest);
  }
}

// Tokens [tok_begin, tok_end) against rows [row, row + R), in tiles of up to kMaxT tokens.
template <class V, WeightType W, int R, int kMaxT, bool kPrefetch>
void MatmulTokenTiles(const MatmulTask& task, int64_t row, int64_t tok_begin, int64_t tok_end) {
  int64_t t = tok_begin;
  for (; t + kMaxT <= tok_end; t += kMaxT) MatmulTile<V, W, R, kMaxT, kPrefetch>(task, row, t);
  MatmulLastTile<V, W, R, kMaxT - 1, kPrefetch>(task, row, t, tok_end - t);
}

// Rows [row_begin, row_end) x tokens [tb, te) in tiles of R rows (single rows for the rest).
template <class V, WeightType W, int R, bool kPrefetch>
void MatmulRowTiles(const MatmulTask& task, int64_t row_begin, int64_t row_end, int64_t tb,
                    int64_t te) {
  int64_t row = row_begin;
  for (; row + R <= row_end; row += R) {
    MatmulTokenTiles<V, W, R, V::kMaxTokens, kPrefetch>(task, row, tb, te);
  }
  for (; row < row_end; ++row) {
    MatmulTokenTiles<V, W, 1, V::kMaxTokens, kPrefetch>(task, row, tb, te);
  }
}

// Rows [row_begin, row_end) for every token. A matvec streams its rows one tile after the other
// and leaves prefetching to the hardware, which follows that single stream best. With several
// tokens each weight byte costs several multiply-adds, so the loads fall behind unless they are
// prefetched; tiles of kRows rows then also save x loads, and tokens go in blocks of
// kTokenBlock so a block of x stays in cache while the rows go by.
template <class V, WeightType W>
void MatmulRowsTyped(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
  if (task.n_tokens == 1) {
    return MatmulRowTiles<V, W, V::kMatvecRows, false>(task, row_begin, row_end, 0, 1);
  }
  constexpr bool kPrefetch = V::kPrefetchBytes > 0;
  if constexpr (kPrefetch) {
    // The tiles prefetch ahead of themselves; cover the start of the range too, since a
    // thread's ranges are not contiguous and nothing before prefetched this one.
    using Elem = typename WeightElem<W>::type;
    const int64_t row_bytes = task.cols * static_cast<int64_t>(sizeof(Elem));
    const char* begin = static_cast<const char*>(task.w) + row_begin * row_bytes;
    const int64_t bytes = (row_end - row_begin) * row_bytes;
    const int64_t distance = PrefetchDistance<V, W>(task);
    const int64_t ahead = bytes < distance ? bytes : distance;
    for (int64_t b = 0; b < ahead; b += 64) V::Prefetch(begin + b);
  }
  for (int64_t tb = 0; tb < task.n_tokens; tb += V::kTokenBlock) {
    const int64_t te = tb + V::kTokenBlock < task.n_tokens ? tb + V::kTokenBlock : task.n_tokens;
    MatmulRowTiles<V, W, V::kRows, kPrefetch>(task, row_begin, row_end, tb, te);
  }
}

template <class V>
void MatmulRows(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
  switch (task.wtype) {
    case WeightType::kF32:
      return MatmulRowsTyped<V, WeightType::kF32>(task, row_begin, row_end);
    case WeightType::kF16:
      return MatmulRowsTyped<V, WeightType::kF16>(task, row_begin, row_end);
    case WeightType::kBF16:
      return MatmulRowsTyped<V, WeightType::kBF16>(task, row_begin, row_end);
  }
}

}  // namespace
}  // namespace specd::kernels::cpu

#undef SPECD_UNROLL

#endif  // SPECD_KERNELS_CPU_SIMD_KERNELS_INL_H_
