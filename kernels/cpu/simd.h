// The innermost loops of the CPU back end, one table per instruction set.
//
// Each table is defined in its own translation unit (simd_scalar.cc, simd_avx2.cc,
// simd_avx512.cc) compiled with that ISA's flags. This header is included by those units, so it
// must stay free of inline library code (no <vector>, absl or kernels/dtype.h): the linker keeps
// one copy of an inline function, and if that copy came from the AVX-512 unit an older CPU would
// execute AVX-512 instructions through it.
//
// Every table computes bit-identical results: a dot product is always 16 fp32 lanes, lane
// l accumulating elements l, l + 16, l + 32, ... with fused multiply-adds (a zero-filled final
// chunk when the length is not a multiple of 16), then the fixed tree reduction
//   s8[i] = v[i] + v[i + 8]; s4[i] = s8[i] + s8[i + 4]; s2[i] = s4[i] + s4[i + 2]; s = s2[0] +
//   s2[1].
// So an output never depends on the ISA, the thread count or the other rows in the batch.
#ifndef SPECD_KERNELS_CPU_SIMD_H_
#define SPECD_KERNELS_CPU_SIMD_H_

#include <cstddef>
#include <cstdint>

namespace specd::kernels::cpu {

// Mirrors kernels::DType (same values, checked in matmul.cc) without including dtype.h here.
enum class WeightType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// y[t, o] = dot(w[o, :], x[t, :]) for a row-major weight in its checkpoint type.
struct MatmulTask {
  const float* x;  // [n_tokens, cols]
  const void* w;   // [rows, cols] of `wtype`
  WeightType wtype;
  float* y;  // [n_tokens, rows]
  int64_t n_tokens;
  int64_t rows;
  int64_t cols;
  bool accumulate;  // y += x · wᵀ
};

struct SimdOps {
  const char* name;
  // Computes y[t, o] for every token t and every o in [row_begin, row_end).
  void (*matmul_rows)(const MatmulTask& task, int64_t row_begin, int64_t row_end);
  // Σ a[i] * b[i] in the canonical order above.
  float (*dot)(const float* a, const float* b, int64_t n);
  // out[r] = dot(a, b + r * stride, n) for r in [0, rows): several canonical dot products at
  // once (attention scores of consecutive cache slots).
  void (*dot_rows)(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                   float* out);
  // For r = 0, 1, ..., rows - 1 in this order: y[i] = fma(w[r], x[r * stride + i], y[i]) for i
  // in [0, n) (attention's weighted sum of value rows; y stays in registers across rows).
  void (*axpy_rows)(const float* w, const float* x, int64_t stride, int64_t rows, int64_t n,
                    float* y);
  // Reads every byte of [data, data + n_bytes) and returns a sum that depends on all of them
  // (for the read-bandwidth probe; the result is used so the reads cannot be optimised away).
  uint64_t (*read_sum)(const void* data, size_t n_bytes);
};

// Defined as constant-initialised data, so taking one never runs code compiled for its ISA. The
// x86 tables exist only in x86 builds; cpu_isa.cc refers to them only there.
extern const SimdOps kScalarSimdOps;
extern const SimdOps kAvx2SimdOps;
extern const SimdOps kAvx512SimdOps;

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_SIMD_H_
