// Strict parser of the safetensors format (https://github.com/huggingface/safetensors):
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section) plus an optional "__metadata__": {string: string}. The tensors
// must cover the data section exactly: no gaps, no overlaps, no trailing bytes.
#ifndef SPECD_COMMON_MODEL_SAFETENSORS_H_
#define SPECD_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace specd {

// Every dtype of the safetensors format, so that sizes of tensors we never load are still checked.
enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kF8E4M3,
  kF8E5M2,
};

// The name used in headers, e.g. "BF16", "F8_E4M3".
std::string_view SafetensorsDTypeName(SafetensorsDType dtype);
// Bytes per element.
int64_t SafetensorsDTypeSize(SafetensorsDType dtype);
// nullopt for a name that is not a safetensors dtype.
std::optional<SafetensorsDType> SafetensorsDTypeFromName(std::string_view name);

SafetensorsDType ToSafetensorsDType(kernels::DType dtype);
// F32, F16 and BF16 map to kernels::DType; every other dtype is nullopt.
std::optional<kernels::DType> ToKernelDType(SafetensorsDType dtype);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 1;  // product of `shape` (1 for a scalar)
  // Byte range [data_begin, data_end) relative to the start of the data section.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                 // file offset of the data section: 8 + N
  std::vector<SafetensorsTensor> tensors;  // in data order
  std::map<std::string, std::string, std::less<>> metadata;

  // nullptr when there is no tensor called `name`.
  const SafetensorsTensor* Find(std::string_view name) const;

  // The bytes of `tensor` inside `file_bytes`, the buffer this header was parsed from.
  std::string_view TensorBytes(std::string_view file_bytes, const SafetensorsTensor& tensor) const {
    return file_bytes.substr(data_start + tensor.data_begin, tensor.data_end - tensor.data_begin);
  }

 private:
  friend absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view,
                                                                  std::string_view);
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in `tensors`
};

// Headers larger than this are rejected as absurd (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates the header of a whole safetensors file held in `file_bytes`. A pure
// function of its input. Errors name `file_name_for_errors` and the tensor: DATA_LOSS when the file
// is shorter than its header says (truncated), INVALID_ARGUMENT for anything else malformed.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file_bytes,
                                                         std::string_view file_name_for_errors);

// The dtype of `tensor` for use as model weights: INVALID_ARGUMENT naming the tensor and file
// unless it is F32, F16 or BF16.
absl::StatusOr<kernels::DType> WeightDType(const SafetensorsTensor& tensor,
                                           std::string_view file_name_for_errors);

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_SAFETENSORS_H_
