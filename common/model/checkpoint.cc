#include "common/model/checkpoint.h"

#include <exception>
#include <system_error>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/absl_string.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using json = nlohmann::json;

// A real index lists a few thousand tensors; anything near this is not an index.
constexpr size_t kMaxIndexBytes = 100'000'000;

// The index is client input: a shard name must never reach outside the checkpoint directory.
absl::Status CheckShardName(std::string_view shard, absl::string_view tensor,
                            absl::string_view index_path) {
  const bool plain = !shard.empty() && shard != "." && shard != ".." &&
                     shard.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
  if (plain) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(index_path, ": weight_map maps tensor \"", tensor, "\" to \"", ToAbsl(shard),
                   "\", which is not a plain file name in the checkpoint directory"));
}

bool IsRegularFile(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace

absl::StatusOr<const Checkpoint::Shard*> Checkpoint::AddShard(const std::filesystem::path& path) {
  auto shard = std::make_unique<Shard>();
  SPECD_ASSIGN_OR_RETURN(shard->file, MappedFile::Open(path));
  SPECD_ASSIGN_OR_RETURN(shard->header,
                         ParseSafetensorsHeader(shard->file->bytes(), path.string()));
  shards_.push_back(std::move(shard));
  return shards_.back().get();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFile(
    const std::filesystem::path& file) {
  auto checkpoint = absl::WrapUnique(new Checkpoint(file.string()));
  SPECD_ASSIGN_OR_RETURN(const Shard* shard, checkpoint->AddShard(file));
  for (const SafetensorsTensor& t : shard->header.tensors) {
    checkpoint->tensors_.emplace(t.name, Entry{shard, &t});
  }
  return checkpoint;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::filesystem::path& dir) {
  const std::filesystem::path single = dir / kSingleFileName;
  if (IsRegularFile(single)) return OpenFile(single);

  const std::filesystem::path index_path = dir / kIndexFileName;
  if (!IsRegularFile(index_path)) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint directory ", dir.string(), " does not exist"));
    }
    return absl::NotFoundError(absl::StrCat("no ", ToAbsl(kSingleFileName), " or ",
                                            ToAbsl(kIndexFileName), " in ", dir.string()));
  }
  const std::string index_name = index_path.string();
  SPECD_ASSIGN_OR_RETURN(const std::unique_ptr<MappedFile> index_file,
                         MappedFile::Open(index_path));
  if (index_file->size() > kMaxIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(index_name, " is ", index_file->size(),
                                                   " bytes; an index is at most ", kMaxIndexBytes));
  }
  const json index = json::parse(index_file->bytes(), nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(index_name, " is not valid JSON"));
  }
  const auto map_it = index.is_object() ? index.find("weight_map") : index.end();
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        index_name, ": expected an object with \"weight_map\": {tensor name: shard file}"));
  }

  auto checkpoint = absl::WrapUnique(new Checkpoint(index_name));
  std::map<std::string, const Shard*, std::less<>> shards_by_name;
  for (const auto& [tensor, shard_value] : map_it->items()) {
    if (!shard_value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_name, ": weight_map[\"", tensor, "\"] must be a file name string"));
    }
    const std::string& shard_name = shard_value.get_ref<const std::string&>();
    SPECD_RETURN_IF_ERROR(CheckShardName(shard_name, tensor, index_name));
    auto shard_it = shards_by_name.find(shard_name);
    if (shard_it == shards_by_name.end()) {
      SPECD_ASSIGN_OR_RETURN(const Shard* shard, checkpoint->AddShard(dir / shard_name));
      shard_it = shards_by_name.emplace(shard_name, shard).first;
    }
    const Shard* shard = shard_it->second;
    const SafetensorsTensor* info = shard->header.Find(tensor);
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat(index_name, " maps tensor \"", tensor, "\" to ",
                                              shard->file->path().string(),
                                              ", which has no such tensor"));
    }
    checkpoint->tensors_.emplace(tensor, Entry{shard, info});
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<Checkpoint::Entry> Checkpoint::Find(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", ToAbsl(name), " not found in ", source_));
  }
  return it->second;
}

absl::StatusOr<RawTensorView> Checkpoint::GetRaw(std::string_view name) const {
  SPECD_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  return RawTensorView{entry.shard->header.TensorBytes(entry.shard->file->bytes(), *entry.tensor),
                       entry.tensor->dtype, entry.tensor->shape};
}

absl::StatusOr<TensorView> Checkpoint::Get(std::string_view name) const {
  SPECD_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  const std::string file = entry.shard->file->path().string();
  SPECD_ASSIGN_OR_RETURN(const kernels::DType dtype, WeightDType(*entry.tensor, file));
  // The mapping is page-aligned, so the file offset decides the alignment kernels rely on.
  const uint64_t offset = entry.shard->header.data_start + entry.tensor->data_begin;
  if (entry.tensor->numel != 0 && offset % static_cast<uint64_t>(kernels::DTypeSize(dtype)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": tensor ", ToAbsl(name), " starts at byte ", offset, ", not a multiple of its ",
        kernels::DTypeSize(dtype), "-byte ", ToAbsl(kernels::DTypeName(dtype)),
        " elements; rewrite the file with aligned tensors"));
  }
  const std::string_view bytes =
      entry.shard->header.TensorBytes(entry.shard->file->bytes(), *entry.tensor);
  return TensorView{bytes.data(), dtype, entry.tensor->shape};
}

std::string Checkpoint::FileOf(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? std::string() : it->second.shard->file->path().string();
}

}  // namespace specd
