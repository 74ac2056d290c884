#include "services/common/weights_fingerprint.h"

#include <cstddef>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/sha256.h"

namespace specd {
namespace {

constexpr size_t kWholeTensorBytes = size_t{64} << 10;
constexpr size_t kWindows = 16;
constexpr size_t kWindowBytes = size_t{4} << 10;

}  // namespace

std::string WeightsFingerprint(const Checkpoint& checkpoint) {
  tokenizer::Sha256 hash;
  // Length-prefixed, so that no two different tensor lists hash the same bytes.
  const auto field = [&](std::string_view s) {
    hash.Update(absl::StrCat(s.size(), ":"));
    hash.Update(s);
  };
  for (const std::string& name : checkpoint.Names()) {
    const absl::StatusOr<RawTensorView> tensor = checkpoint.GetRaw(name);
    if (!tensor.ok()) continue;  // Names() lists only tensors GetRaw finds
    field(name);
    field(absl::StrCat(std::string(SafetensorsDTypeName(tensor->dtype)), "[",
                       absl::StrJoin(tensor->shape, ","), "]"));
    const std::string_view bytes = tensor->bytes;
    if (bytes.size() <= kWholeTensorBytes) {
      field(bytes);
      continue;
    }
    const size_t last_start = bytes.size() - kWindowBytes;
    for (size_t i = 0; i < kWindows; ++i) {
      field(bytes.substr(last_start * i / (kWindows - 1), kWindowBytes));
    }
  }
  return hash.HexDigest();
}

}  // namespace specd
