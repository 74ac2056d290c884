// Test-only helpers for the CPU back-end tests: plain double-precision reference ops written
// independently of kernels/cpu, bit-level f16/bf16 decoders, numpy-style allclose, and output
// buffers with guard zones that catch out-of-bounds writes.
#ifndef SPECD_TESTS_KERNELS_CPU_REFERENCE_H_
#define SPECD_TESTS_KERNELS_CPU_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/dtype.h"

namespace specd::kernels::cpu_test {

// IEEE binary16 from its fields: (-1)^s * 2^(e-15) * (1 + m/1024), subnormal 2^-14 * m/1024.
inline double RefDecodeF16(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(1.0 + mant / 1024.0, exp - 15);
  }
  return sign ? -v : v;
}

// bfloat16: 8 exponent bits (bias 127), 7 mantissa bits.
inline double RefDecodeBf16(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -133);
  } else if (exp == 255) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(1.0 + mant / 128.0, exp - 127);
  }
  return sign ? -v : v;
}

// A weight matrix in one dtype plus its exact values as doubles, for the references.
struct TestWeight {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> values;

  const void* data() const { return bytes.data(); }
};

// Random finite weights in about [-2, 2]. The 16-bit types are drawn as random bit patterns
// (sign, a small exponent range, any mantissa), so no encoder under test is involved.
inline TestWeight RandomWeight(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestWeight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  const int64_t n = rows * cols;
  w.values.resize(static_cast<size_t>(n));
  w.bytes.resize(static_cast<size_t>(n * DTypeSize(dtype)));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int> bit(0, 1);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: {
        const float f = uniform(rng);
        std::memcpy(&w.bytes[i * 4], &f, 4);
        w.values[i] = f;
        break;
      }
      case DType::kF16: {
        // exponent 10..15: magnitudes in [2^-5, 2)
        const uint16_t h = static_cast<uint16_t>(
            (bit(rng) << 15) | (std::uniform_int_distribution<int>(10, 15)(rng) << 10) |
            std::uniform_int_distribution<int>(0, 1023)(rng));
        std::memcpy(&w.bytes[i * 2], &h, 2);
        w.values[i] = RefDecodeF16(h);
        break;
      }
      case DType::kBF16: {
        const uint16_t h = static_cast<uint16_t>(
            (bit(rng) << 15) | (std::uniform_int_distribution<int>(122, 127)(rng) << 7) |
            std::uniform_int_distribution<int>(0, 127)(rng));
        std::memcpy(&w.bytes[i * 2], &h, 2);
        w.values[i] = RefDecodeBf16(h);
        break;
      }
    }
  }
  return w;
}

inline std::vector<float> RandomFloats(int64_t n, std::mt19937& rng, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// A float buffer with kGuard sentinel elements on each side. The payload also starts as the
// sentinel, so an element the kernel forgets to write shows up as a NaN in the comparison.
class GuardedBuffer {
 public:
  static constexpr int64_t kGuard = 64;
  static constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;  // a NaN no kernel produces

  explicit GuardedBuffer(int64_t n) : n_(n), storage_(static_cast<size_t>(n + 2 * kGuard)) {
    float sentinel;
    std::memcpy(&sentinel, &kSentinelBits, 4);
    for (float& f : storage_) f = sentinel;
  }
  GuardedBuffer(int64_t n, const std::vector<float>& init) : GuardedBuffer(n) {
    std::memcpy(data(), init.data(), static_cast<size_t>(n) * sizeof(float));
  }

  float* data() { return storage_.data() + kGuard; }
  const float* data() const { return storage_.data() + kGuard; }
  int64_t size() const { return n_; }
  std::vector<float> payload() const { return std::vector<float>(data(), data() + n_); }

  ::testing::AssertionResult GuardsIntact() const {
    for (int64_t i = 0; i < kGuard; ++i) {
      for (const int64_t at : {i, kGuard + n_ + i}) {
        uint32_t bits;
        std::memcpy(&bits, &storage_[static_cast<size_t>(at)], 4);
        if (bits != kSentinelBits) {
          return ::testing::AssertionFailure()
                 << "write outside the output buffer at offset " << (at - kGuard) << " (buffer has "
                 << n_ << " elements)";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  int64_t n_;
  std::vector<float> storage_;
};

// numpy.allclose semantics per element: |got - want| <= atol + rtol * |want|, plus both finite.
// `atol` may differ per element (pass one per element, or a single value).
inline ::testing::AssertionResult AllClose(const float* got, const std::vector<double>& want,
                                           const std::vector<double>& atol, double rtol) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = atol.size() == 1 ? atol[0] : atol[i];
    if (!std::isfinite(got[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << got[i] << " (want " << want[i] << ")";
    }
    if (std::fabs(got[i] - want[i]) > a + rtol * std::fabs(want[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i] << " (|diff| "
             << std::fabs(got[i] - want[i]) << " > atol " << a << " + rtol " << rtol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// The same bits, and no NaN: a kernel writes none, and an output element a kernel forgot to
// write reads as NaN (the conformance suite's Device fills outputs with it), which must not pass
// because both runs forgot it.
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0 &&
         std::none_of(a.begin(), a.end(), [](float v) { return std::isnan(v); });
}

// Every kernel table this machine can run, scalar first.
inline std::vector<cpu::CpuIsa> SupportedIsas() {
  std::vector<cpu::CpuIsa> isas;
  for (const cpu::CpuIsa isa : {cpu::CpuIsa::kScalar, cpu::CpuIsa::kAvx2, cpu::CpuIsa::kAvx512}) {
    if (cpu::CpuIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

inline const std::vector<cpu::CpuIsa>& AllIsas() {
  static const std::vector<cpu::CpuIsa> all = {cpu::CpuIsa::kScalar, cpu::CpuIsa::kAvx2,
                                               cpu::CpuIsa::kAvx512};
  return all;
}

}  // namespace specd::kernels::cpu_test

#endif  // SPECD_TESTS_KERNELS_CPU_REFERENCE_H_
