// Read-only memory mapping of a whole file, unmapped when the object dies.
#ifndef SPECD_COMMON_MODEL_MAPPED_FILE_H_
#define SPECD_COMMON_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

namespace specd {

class MappedFile {
 public:
  // Maps `path` read-only. NOT_FOUND if it does not exist, PERMISSION_DENIED if it cannot be read,
  // FAILED_PRECONDITION if it is not a regular file. An empty file maps to empty `bytes()`.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::filesystem::path& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The file's contents; valid as long as this object lives. The start is page-aligned.
  std::string_view bytes() const {
    return std::string_view(static_cast<const char*>(data_), size_);
  }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile(std::filesystem::path path, const void* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::filesystem::path path_;
  const void* data_;  // nullptr for an empty file: mmap cannot map zero bytes
  size_t size_;
};

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_MAPPED_FILE_H_
