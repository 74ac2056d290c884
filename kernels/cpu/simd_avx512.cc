// AVX-512 (F, BW, VL) kernels. This unit alone is compiled with -mavx512f -mavx512bw -mavx512vl;
// it is reached only through kAvx512SimdOps after cpu_isa.cc has checked the CPU. Keep it free of
// inline library code (see simd.h).
// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics
// (GCC bug 105593); the warning points into the header, so silence it for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/simd.h"

namespace specd::kernels::cpu {
namespace {

struct Avx512 {
  using Vec = __m512;

  // 4 rows x 6 tokens keeps 24 accumulators, 4 weight vectors and an x vector in the 32 zmm
  // registers.
  static constexpr int kRows = 4;
  // Measured on Zen 4 (with 4 KiB and with 2 MiB pages): one row at a time without software
  // prefetch streams a matvec at the full read rate; 4-row tiles lose 5-30%.
  static constexpr int kMatvecRows = 1;
  static constexpr int kMaxTokens = 6;
  static constexpr int kTokenBlock = 48;
  // Measured on Zen 4: without it a 5-token matmul, which does 5x the arithmetic per weight
  // byte, streams at ~60% of the read rate; with 16 KiB ahead, at 75-100%.
  static constexpr int kPrefetchBytes = 16384;

  // Into L2 only: the L1 has too few miss buffers for a prefetch distance this long.
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T2); }

  static __mmask16 TailMask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static Vec LoadF32Tail(const float* p, int n) { return _mm512_maskz_loadu_ps(TailMask(n), p); }
  static Vec LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec LoadF16Tail(const uint16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(TailMask(n), p));
  }
  // bf16 is the top half of an f32: widen each 16-bit lane to 32 bits and shift it up.
  static Vec WidenBf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static Vec LoadBf16(const uint16_t* p) {
    return WidenBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec LoadBf16Tail(const uint16_t* p, int n) {
    return WidenBf16(_mm256_maskz_loadu_epi16(TailMask(n), p));
  }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec Set1(float f) { return _mm512_set1_ps(f); }
  static void StoreF32(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static void StoreF32Tail(float* p, Vec v, int n) { _mm512_mask_storeu_ps(p, TailMask(n), v); }
  static float Reduce(Vec v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);
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

void MatmulRowsAvx512(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
  MatmulRows<Avx512>(task, row_begin, row_end);
}

float DotAvx512(const float* a, const float* b, int64_t n) { return Dot<Avx512>(a, b, n); }

void DotRowsAvx512(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                   float* out) {
  DotRows<Avx512>(a, b, stride, rows, n, out);
}

void AxpyRowsAvx512(const float* w, const float* x, int64_t stride, int64_t rows, int64_t n,
                    float* y) {
  AxpyRows<Avx512>(w, x, stride, rows, n, y);
}

constexpr int kReadPrefetchBytes = 4096;

uint64_t ReadSumAvx512(const void* data, size_t n_bytes) {
  const char* p = static_cast<const char*>(data);
  // Four independent accumulators so the adds never limit the load rate.
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= n_bytes; i += 256) {
    // Software prefetch lifts plain streaming by ~5% here, so the probe gets it too: the figure
    // is meant as the best read rate, not the hardware prefetcher's.
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(p + i) + kReadPrefetchBytes;
    for (int b = 0; b < 256; b += 64) Avx512::Prefetch(reinterpret_cast<const void*>(ahead + b));
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
  }
  // Not _mm512_reduce_add_epi64: GCC implements it with signed adds, and the sum wraps.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (const uint64_t lane : lanes) sum += lane;
  for (; i < n_bytes; ++i) sum += static_cast<unsigned char>(p[i]);
  return sum;
}

}  // namespace

extern const SimdOps kAvx512SimdOps = {
    .name = "avx512",
    .matmul_rows = &MatmulRowsAvx512,
    .dot = &DotAvx512,
    .dot_rows = &DotRowsAvx512,
    .axpy_rows = &AxpyRowsAvx512,
    .read_sum = &ReadSumAvx512,
};

}  // namespace specd::kernels::cpu
