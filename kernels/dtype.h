// Element types of weights as stored in checkpoints, and of the KV cache (`--kv-dtype`).
// Activations are always f32.
#ifndef SPECD_KERNELS_DTYPE_H_
#define SPECD_KERNELS_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace specd::kernels {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

constexpr int64_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

// The `--kv-dtype` spelling: "f32", "bf16" or "f16"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<DType> ParseKvDType(std::string_view name);
// The inverse: "f32", "bf16" or "f16".
std::string_view KvDTypeFlagName(DType t);

inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Reads element `i` of a buffer of type `t` as f32 (scalar path, for small tensors and tests).
inline float LoadAsF32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_DTYPE_H_
