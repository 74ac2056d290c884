#include "common/model/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/absl_string.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using ordered_json = nlohmann::ordered_json;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

absl::Status WriteError(const std::filesystem::path& path, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", what, " ", path.string(), ": ", std::strerror(errno)));
}

}  // namespace

absl::Status SafetensorsWriter::Add(std::string name, SafetensorsDType dtype,
                                    std::vector<int64_t> shape, std::string bytes) {
  if (name == "__metadata__") {
    return absl::InvalidArgumentError(
        "safetensors: \"__metadata__\" is reserved, not a tensor name");
  }
  if (names_.count(name) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: tensor ", name, " was already added"));
  }
  try {
    (void)ordered_json(name).dump();
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: tensor name \"", name, "\" is not valid UTF-8"));
  }
  int64_t numel = 1;
  for (const int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor ", name,
                                                     " has an invalid shape [",
                                                     absl::StrJoin(shape, ", "), "]"));
    }
  }
  const int64_t element_size = SafetensorsDTypeSize(dtype);
  int64_t expected = 0;
  if (__builtin_mul_overflow(numel, element_size, &expected) ||
      static_cast<uint64_t>(expected) != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: tensor ", name, " has ", bytes.size(), " bytes but shape [",
                     absl::StrJoin(shape, ", "), "] of ", ToAbsl(SafetensorsDTypeName(dtype)),
                     " needs ", expected));
  }
  // The header is padded to a multiple of 8, so an offset that is a multiple of the element size
  // in the data section is one in the file too. An empty tensor has nothing to align.
  if (!bytes.empty() && data_size_ % static_cast<uint64_t>(element_size) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: tensor ", name, " (", ToAbsl(SafetensorsDTypeName(dtype)),
                     ") would start at byte ", data_size_,
                     " of the data, not a multiple of its element size; add wider dtypes first"));
  }
  data_size_ += bytes.size();
  names_.insert(name);
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), std::move(bytes)});
  return absl::OkStatus();
}

absl::StatusOr<std::string> SafetensorsWriter::SerializeHeader() const {
  ordered_json header = ordered_json::object();
  if (!metadata_.empty()) {
    ordered_json metadata = ordered_json::object();
    for (const auto& [key, value] : metadata_) metadata[key] = value;
    header["__metadata__"] = std::move(metadata);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    ordered_json entry = ordered_json::object();
    entry["dtype"] = SafetensorsDTypeName(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    offset += t.bytes.size();
    header[t.name] = std::move(entry);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: cannot encode the header: ", e.what()));
  }
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  return out;
}

absl::StatusOr<std::string> SafetensorsWriter::Serialize() const {
  SPECD_ASSIGN_OR_RETURN(std::string out, SerializeHeader());
  out.reserve(out.size() + data_size_);
  for (const Tensor& t : tensors_) out += t.bytes;
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::filesystem::path& path) const {
  SPECD_ASSIGN_OR_RETURN(const std::string header, SerializeHeader());
  const std::filesystem::path temp = path.string() + ".partial";
  {
    const std::unique_ptr<std::FILE, FileCloser> f(std::fopen(temp.c_str(), "wb"));
    if (f == nullptr) return WriteError(temp, "create");
    bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
    for (const Tensor& t : tensors_) {
      ok = ok && std::fwrite(t.bytes.data(), 1, t.bytes.size(), f.get()) == t.bytes.size();
    }
    ok = ok && std::fflush(f.get()) == 0;
    if (!ok) {
      const absl::Status status = WriteError(temp, "write");
      std::error_code ec;
      std::filesystem::remove(temp, ec);
      return status;
    }
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    const absl::Status status = absl::UnavailableError(
        absl::StrCat("cannot rename ", temp.string(), " to ", path.string(), ": ", ec.message()));
    std::filesystem::remove(temp, ec);
    return status;
  }
  return absl::OkStatus();
}

}  // namespace specd
