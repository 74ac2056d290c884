// Portable kernels: the same 16-lane algorithm as the SIMD tables, one lane at a time, with
// std::fma for the fused multiply-add. Bit-identical to them, slower; used on CPUs without
// AVX2 and as the reference the SIMD tables are checked against.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/simd.h"
#include "kernels/dtype.h"

namespace specd::kernels::cpu {
namespace {

struct Scalar {
  struct Vec {
    float v[16];
  };

  static constexpr int kRows = 2;
  static constexpr int kMatvecRows = 2;
  static constexpr int kMaxTokens = 2;
  static constexpr int kTokenBlock = 32;
  static constexpr int kPrefetchBytes = 0;

  static void Prefetch(const void*) {}

  static Vec Zero() { return Vec{}; }
  static Vec LoadF32(const float* p) {
    Vec r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static Vec LoadF32Tail(const float* p, int n) {
    Vec r{};
    std::memcpy(r.v, p, static_cast<size_t>(n) * sizeof(float));
    return r;
  }
  static Vec LoadF16Tail(const uint16_t* p, int n) {
    Vec r{};
    for (int i = 0; i < n; ++i) r.v[i] = F16ToF32(p[i]);
    return r;
  }
  static Vec LoadBf16Tail(const uint16_t* p, int n) {
    Vec r{};
    for (int i = 0; i < n; ++i) r.v[i] = Bf16ToF32(p[i]);
    return r;
  }
  static Vec LoadF16(const uint16_t* p) { return LoadF16Tail(p, 16); }
  static Vec LoadBf16(const uint16_t* p) { return LoadBf16Tail(p, 16); }
  static Vec Set1(float f) {
    Vec r;
    for (float& x : r.v) x = f;
    return r;
  }
  static void StoreF32(float* p, const Vec& v) { std::memcpy(p, v.v, sizeof v.v); }
  static void StoreF32Tail(float* p, const Vec& v, int n) {
    std::memcpy(p, v.v, static_cast<size_t>(n) * sizeof(float));
  }
  static Vec Fma(const Vec& a, const Vec& b, const Vec& c) {
    Vec r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static float Reduce(const Vec& v) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; ++i) s8[i] = v.v[i] + v.v[i + 8];
    for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
    const float s2_0 = s4[0] + s4[2];
    const float s2_1 = s4[1] + s4[3];
    return s2_0 + s2_1;
  }
};

}  // namespace
}  // namespace specd::kernels::cpu

#include "kernels/cpu/simd_kernels_inl.h"

namespace specd::kernels::cpu {
namespace {

void MatmulRowsScalar(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
  MatmulRows<Scalar>(task, row_begin, row_end);
}

float DotScalar(const float* a, const float* b, int64_t n) { return Dot<Scalar>(a, b, n); }

void DotRowsScalar(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                   float* out) {
  DotRows<Scalar>(a, b, stride, rows, n, out);
}

void AxpyRowsScalar(const float* w, const float* x, int64_t stride, int64_t rows, int64_t n,
                    float* y) {
  AxpyRows<Scalar>(w, x, stride, rows, n, y);
}

uint64_t ReadSumScalar(const void* data, size_t n_bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 8 <= n_bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, sizeof word);
    sum += word;
  }
  for (; i < n_bytes; ++i) sum += p[i];
  return sum;
}

}  // namespace

extern const SimdOps kScalarSimdOps = {
    .name = "scalar",
    .matmul_rows = &MatmulRowsScalar,
    .dot = &DotScalar,
    .dot_rows = &DotRowsScalar,
    .axpy_rows = &AxpyRowsScalar,
    .read_sum = &ReadSumScalar,
};

}  // namespace specd::kernels::cpu
