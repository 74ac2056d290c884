// f16/bf16 conversions of kernels/dtype.h against published bit patterns, an independent
// field-by-field decoder, exhaustive rounding-boundary checks and, where the CPU has them, the
// hardware conversion instructions (F16C vcvtps2ph/vcvtph2ps, AVX512-BF16 vcvtneps2bf16).
#include "kernels/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels {
namespace {

using cpu_test::RefDecodeBf16;
using cpu_test::RefDecodeF16;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

#if defined(__x86_64__)
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
bool HasAvx512Bf16() {
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
}

__attribute__((target("f16c"))) uint16_t HardwareF32ToF16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareF16ToF32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("avx512bf16,avx512vl"))) uint16_t HardwareF32ToBf16(float f) {
  const __m128bh r = _mm_cvtneps_pbh(_mm_set1_ps(f));
  uint16_t out;
  std::memcpy(&out, &r, 2);
  return out;
}
#else
// No hardware conversions to compare with on this architecture; those tests skip.
bool HasF16c() { return false; }
bool HasAvx512Bf16() { return false; }
uint16_t HardwareF32ToF16(float) { return 0; }
float HardwareF16ToF32(uint16_t) { return 0.0f; }
uint16_t HardwareF32ToBf16(float) { return 0; }
#endif

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
}

TEST(F16Test, KnownBitPatterns) {
  struct Case {
    float value;
    uint16_t bits;
  };
  const Case cases[] = {
      {1.0f, 0x3c00},
      {-2.5f, 0xc100},
      {65504.0f, 0x7bff},                  // largest finite
      {std::ldexp(1.0f, -14), 0x0400},     // smallest normal
      {std::ldexp(1.0f, -24), 0x0001},     // smallest subnormal
      {std::ldexp(1023.0f, -24), 0x03ff},  // largest subnormal
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {0.333251953125f, 0x3555},  // 1/3 rounded to f16
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(F32ToF16(c.value), c.bits) << c.value;
    EXPECT_EQ(Bits(F16ToF32(c.bits)), Bits(c.value)) << std::hex << c.bits;
  }
  EXPECT_EQ(F32ToF16(0.1f), 0x2e66);  // 0.0999755859375
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0xfc01)));
  const uint16_t nan = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(F16Test, RoundToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even 1.0
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even 1 + 2^-9
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);                          // below the tie: stays finite
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                          // tie with 2^16 -> inf
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even 0
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // tie -> even 2
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(2047.0f, -25)), 0x0400);  // subnormal rounds up to normal
  EXPECT_EQ(F32ToF16(1e-10f), 0x0000);
  EXPECT_EQ(F32ToF16(-1e-10f), 0x8000);
}

// Every f16 decodes to the value its fields say, and encodes back to itself.
TEST(F16Test, ExhaustiveDecodeAndRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = RefDecodeF16(static_cast<uint16_t>(h));
    const float got = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    ASSERT_EQ(F32ToF16(got), h) << std::hex << h;
    if (HasF16c()) {
      ASSERT_EQ(Bits(HardwareF16ToF32(static_cast<uint16_t>(h))), Bits(got)) << std::hex << h;
    }
  }
}

// Midway between every pair of neighbouring f16 values (exact in f32): the tie goes to the even
// pattern, one f32 ulp either side goes to the nearer one.
TEST(F16Test, ExhaustiveTiesBetweenNeighbours) {
  for (uint16_t lo = 0; lo < 0x7bff; ++lo) {
    const uint16_t hi = lo + 1;
    const float mid = static_cast<float>((RefDecodeF16(lo) + RefDecodeF16(hi)) / 2);
    const uint16_t even = (lo % 2 == 0) ? lo : hi;
    for (const float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(F32ToF16(sign * mid), even | s) << std::hex << lo;
      ASSERT_EQ(F32ToF16(sign * std::nextafter(mid, 0.0f)), lo | s) << std::hex << lo;
      ASSERT_EQ(F32ToF16(sign * std::nextafter(mid, INFINITY)), hi | s) << std::hex << lo;
    }
  }
}

TEST(F16Test, MatchesF16cOnRandomFloats) {
  if (!HasF16c()) GTEST_SKIP() << "this CPU has no F16C instructions to compare with";
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) continue;  // ours drops NaN payloads on purpose
    ASSERT_EQ(F32ToF16(f), HardwareF32ToF16(f)) << std::hexfloat << f;
  }
}

TEST(Bf16Test, KnownBitPatterns) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(-2.5f), 0xc020);
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(F32ToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(F32ToBf16(3.0e38f), 0x7f62);                          // 2.9915e38, finite
  EXPECT_EQ(F32ToBf16(FromBits(0x7f7fffffu)), 0x7f80);            // FLT_MAX rounds to inf
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even
  EXPECT_EQ(F32ToBf16(FromBits(0x3f808001u)), 0x3f81);            // just above the tie
  EXPECT_EQ(F32ToBf16(FromBits(0x00008000u)), 0x0000);            // subnormal tie -> even
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000u)), 0x0002);
  const uint16_t nan = F32ToBf16(FromBits(0x7f800001u));  // signalling NaN: must stay NaN
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_EQ(Bits(Bf16ToF32(0x3f80)), Bits(1.0f));
  EXPECT_EQ(static_cast<double>(Bf16ToF32(0x0001)), std::ldexp(1.0, -133));
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7fc0)));
}

TEST(Bf16Test, ExhaustiveDecodeAndRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = RefDecodeBf16(static_cast<uint16_t>(h));
    const float got = Bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    ASSERT_EQ(F32ToBf16(got), h) << std::hex << h;
    ASSERT_EQ(LoadAsF32(&h, DType::kBF16, 0), got);
  }
}

TEST(Bf16Test, MatchesAvx512Bf16OnRandomNormalFloats) {
  if (!HasAvx512Bf16()) GTEST_SKIP() << "this CPU has no AVX512-BF16 instructions to compare with";
  std::mt19937 rng(12);
  for (int i = 0; i < 2000000; ++i) {
    const float f = FromBits(rng());
    // vcvtneps2bf16 flushes subnormal inputs to zero; ours keeps them.
    if (std::fpclassify(f) == FP_SUBNORMAL) continue;
    ASSERT_EQ(F32ToBf16(f), HardwareF32ToBf16(f)) << std::hex << Bits(f);
  }
}

}  // namespace
}  // namespace specd::kernels
