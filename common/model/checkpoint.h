// The tensors of a Hugging Face checkpoint directory, memory-mapped: either one
// `model.safetensors`, or `model.safetensors.index.json` ({"weight_map": {tensor: shard file}})
// and its shards. Every file is mapped once; views stay valid while the Checkpoint lives.
#ifndef SPECD_COMMON_MODEL_CHECKPOINT_H_
#define SPECD_COMMON_MODEL_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/mapped_file.h"
#include "common/model/safetensors.h"
#include "kernels/dtype.h"

namespace specd {

// A tensor usable as weights (F32, F16 or BF16), pointing into the mapped file.
struct TensorView {
  const void* data = nullptr;  // aligned to DTypeSize(dtype)
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    return n;
  }
};

// Any tensor, whatever its dtype, as raw little-endian bytes.
struct RawTensorView {
  std::string_view bytes;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
};

class Checkpoint {
 public:
  static constexpr std::string_view kSingleFileName = "model.safetensors";
  static constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

  // Opens `dir`. As transformers does, `model.safetensors` wins when both it and the index exist.
  // NOT_FOUND when there is neither. Shard names in the index must be plain file names inside
  // `dir`; every tensor the index names must be in its shard.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::filesystem::path& dir);

  // Opens one safetensors file on its own (tools and tests).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> OpenFile(const std::filesystem::path& file);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  bool Has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

  // All tensor names, sorted.
  std::vector<std::string> Names() const;

  // NOT_FOUND naming the tensor and the checkpoint when absent; INVALID_ARGUMENT when its dtype
  // is not F32/F16/BF16 or its data is not aligned to its element size.
  absl::StatusOr<TensorView> Get(std::string_view name) const;

  // Any dtype; NOT_FOUND when absent.
  absl::StatusOr<RawTensorView> GetRaw(std::string_view name) const;

  // Path of the file holding `name` (empty when absent), for error messages.
  std::string FileOf(std::string_view name) const;

  // The file the tensor list came from: the single file or the index, for error messages.
  const std::string& source() const { return source_; }

 private:
  struct Shard {
    std::unique_ptr<MappedFile> file;
    SafetensorsHeader header;
  };
  struct Entry {
    const Shard* shard;
    const SafetensorsTensor* tensor;
  };

  explicit Checkpoint(std::string source) : source_(std::move(source)) {}

  // Maps `path` and parses its header; the result is owned by `shards_`.
  absl::StatusOr<const Shard*> AddShard(const std::filesystem::path& path);
  absl::StatusOr<Entry> Find(std::string_view name) const;

  std::string source_;
  std::vector<std::unique_ptr<Shard>> shards_;  // unique_ptr: entries point into them
  std::map<std::string, Entry, std::less<>> tensors_;
};

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_CHECKPOINT_H_
