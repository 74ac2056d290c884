// AVX2 + FMA + F16C kernels, for x86-64 CPUs without AVX-512. This unit alone is compiled with
// -mavx2 -mfma -mf16c and is reached only through kAvx2SimdOps after cpu_isa.cc has checked the
// CPU. Keep it free of inline library code (see simd.h). A 16-lane vector is two ymm halves, so
// results are bit-identical to the AVX-512 and scalar tables.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/simd.h"

namespace specd::kernels::cpu {
namespace {

struct Avx2 {
  struct Vec {
    __m256 lo;  // lanes 0..7
    __m256 hi;  // lanes 8..15
  };

  // 16 ymm registers: 2 rows x 2 tokens x 2 halves of accumulators plus the loaded vectors.
  static constexpr int kRows = 2;
  static constexpr int kMatvecRows = 1;
  static constexpr int kMaxTokens = 2;
  static constexpr int kTokenBlock = 32;
  static constexpr int kPrefetchBytes = 16384;  // see simd_avx512.cc

  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T2); }

  static Vec Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Vec LoadF32(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Vec LoadF32Tail(const float* p, int n) {
    alignas(32) float buf[16] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return LoadF32(buf);
  }
  static __m128i Load8(const uint16_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  static Vec LoadF16(const uint16_t* p) {
    return {_mm256_cvtph_ps(Load8(p)), _mm256_cvtph_ps(Load8(p + 8))};
  }
  static __m256 WidenBf16(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static Vec LoadBf16(const uint16_t* p) { return {WidenBf16(Load8(p)), WidenBf16(Load8(p + 8))}; }
  static Vec LoadF16Tail(const uint16_t* p, int n) {
    alignas(32) uint16_t buf[16] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return LoadF16(buf);
  }
  static Vec LoadBf16Tail(const uint16_t* p, int n) {
    alignas(32) uint16_t buf[16] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return LoadBf16(buf);
  }
  static Vec Fma(Vec a, Vec b, Vec c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static Vec Set1(float f) { return {_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
  static void StoreF32(float* p, Vec v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static void StoreF32Tail(float* p, Vec v, int n) {
    alignas(32) float buf[16];
    StoreF32(buf, v);
    for (int i = 0; i < n; ++i) p[i] = buf[i];
  }
  static float Reduce(Vec v) {
    const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
};

}  // namespace
}  // namespace specd::kernels::cpu

#include "kernels/cpu/simd_kernels_inl.h"

namespace specd::kernels::cpu {
namespace {

void MatmulRowsAvx2(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
  MatmulRows<Avx2>(task, row_begin, row_end);
}

float DotAvx2(const float* a, const float* b, int64_t n) { return Dot<Avx2>(a, b, n); }

void DotRowsAvx2(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                 float* out) {
  DotRows<Avx2>(a, b, stride, rows, n, out);
}

void AxpyRowsAvx2(const float* w, const float* x, int64_t stride, int64_t rows, int64_t n,
                  float* y) {
  AxpyRows<Avx2>(w, x, stride, rows, n, y);
}

constexpr int kReadPrefetchBytes = 4096;

uint64_t ReadSumAvx2(const void* data, size_t n_bytes) {
  const char* p = static_cast<const char*>(data);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= n_bytes; i += 128) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(p + i) + kReadPrefetchBytes;
    Avx2::Prefetch(reinterpret_cast<const void*>(ahead));  // see ReadSumAvx512
    Avx2::Prefetch(reinterpret_cast<const void*>(ahead + 64));
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n_bytes; ++i) sum += static_cast<unsigned char>(p[i]);
  return sum;
}

}  // namespace

extern const SimdOps kAvx2SimdOps = {
    .name = "avx2",
    .matmul_rows = &MatmulRowsAvx2,
    .dot = &DotAvx2,
    .dot_rows = &DotRowsAvx2,
    .axpy_rows = &AxpyRowsAvx2,
    .read_sum = &ReadSumAvx2,
};

}  // namespace specd::kernels::cpu
