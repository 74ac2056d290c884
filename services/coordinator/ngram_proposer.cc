#include "services/coordinator/ngram_proposer.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace specd {

absl::Status ValidateNgramOptions(const NgramOptions& o) {
  if (o.min_n < 1 || o.min_n > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ngram-min must be in [1, 64], got ", o.min_n));
  }
  if (o.max_n < o.min_n || o.max_n > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ngram-max must be in [--ngram-min = ", o.min_n, ", 64], got ", o.max_n));
  }
  return absl::OkStatus();
}

std::vector<int32_t> ProposeNgram(std::span<const int32_t> text, int32_t k,
                                  const NgramOptions& options) {
  const int64_t len = static_cast<int64_t>(text.size());
  if (k <= 0) return {};
  for (int64_t n = std::min<int64_t>(options.max_n, len - 1); n >= options.min_n; --n) {
    const std::span<const int32_t> suffix = text.subspan(static_cast<size_t>(len - n));
    // An occurrence starting at i must leave at least one token after it before the text ends:
    // i + n <= len - 1. Search from the latest.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), text.begin() + i)) continue;
      const int64_t from = i + n;
      const int64_t to = std::min(len, from + k);
      return std::vector<int32_t>(text.begin() + from, text.begin() + to);
    }
  }
  return {};
}

std::vector<int32_t> ProposeFromPrediction(std::span<const int32_t> output,
                                           std::span<const int32_t> prediction, int32_t k,
                                           const NgramOptions& options) {
  const int64_t len = static_cast<int64_t>(output.size());
  const int64_t plen = static_cast<int64_t>(prediction.size());
  if (k <= 0 || plen == 0) return {};
  auto from = [&](int64_t at) {
    return std::vector<int32_t>(prediction.begin() + at,
                                prediction.begin() + std::min(plen, at + k));
  };
  if (len == 0) return from(0);
  for (int64_t n = std::min<int64_t>(options.max_n, len); n >= options.min_n; --n) {
    const std::span<const int32_t> suffix = output.subspan(static_cast<size_t>(len - n));
    int64_t best = -1;
    int64_t best_distance = 0;
    // An occurrence ending at e = i + n must leave a token after it: e <= plen - 1.
    for (int64_t i = 0; i + n <= plen - 1; ++i) {
      if (!std::equal(suffix.begin(), suffix.end(), prediction.begin() + i)) continue;
      const int64_t distance = std::abs(i + n - len);
      if (best < 0 || distance < best_distance) {
        best = i;
        best_distance = distance;
      }
    }
    if (best >= 0) return from(best + n);
  }
  return {};
}

}  // namespace specd
