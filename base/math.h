// Integer helpers shared by every layer.
#ifndef SPECD_BASE_MATH_H_
#define SPECD_BASE_MATH_H_

#include <cstdint>

namespace specd {

// a / b rounded up for a >= 0 and b > 0, without the overflow of (a + b - 1) / b near INT64_MAX.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// a rounded up to a multiple of b (a >= 0, b > 0).
constexpr int64_t RoundUpTo(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

}  // namespace specd

#endif  // SPECD_BASE_MATH_H_
