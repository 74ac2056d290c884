// Writes safetensors files: the header in the order tensors were added, padded with spaces to a
// multiple of 8 bytes as the reference implementation does, then the tensors back to back.
#ifndef SPECD_COMMON_MODEL_SAFETENSORS_WRITER_H_
#define SPECD_COMMON_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/safetensors.h"
#include "kernels/dtype.h"

namespace specd {

class SafetensorsWriter {
 public:
  // Adds a tensor whose little-endian data is `bytes` (taken over, not copied again).
  // INVALID_ARGUMENT when the name is taken or reserved, the size does not match the shape, or
  // the tensor would not start at a multiple of its element size (readers map the data in place,
  // so add wider dtypes first when mixing them).
  absl::Status Add(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape,
                   std::string bytes);
  absl::Status Add(std::string name, kernels::DType dtype, std::vector<int64_t> shape,
                   std::string bytes) {
    return Add(std::move(name), ToSafetensorsDType(dtype), std::move(shape), std::move(bytes));
  }

  // Sets an entry of the optional "__metadata__" map (e.g. {"format": "pt"}).
  void SetMetadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }

  // The 8-byte length and the padded JSON header.
  absl::StatusOr<std::string> SerializeHeader() const;
  // The whole file.
  absl::StatusOr<std::string> Serialize() const;

  // Writes the file through a temporary name and renames it, so a reader never sees half a file.
  absl::Status WriteFile(const std::filesystem::path& path) const;

 private:
  struct Tensor {
    std::string name;
    SafetensorsDType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Tensor> tensors_;
  std::set<std::string, std::less<>> names_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_size_ = 0;
};

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_SAFETENSORS_WRITER_H_
