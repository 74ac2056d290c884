#include "base/inverse_cdf.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specd {
namespace {

absl::Status CheckUniform(double u) {
  if (!(u >= 0.0 && u < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("uniform u must be in [0, 1), got ", u));
  }
  return absl::OkStatus();
}

// The fp64 total of the row, or INVALID_ARGUMENT naming the first bad entry.
absl::StatusOr<double> RowTotal(std::span<const float> probs) {
  double total = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const float p = probs[i];
    if (!(p >= 0.0f) || std::isinf(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("probs[", i, "] = ", p, " is not a probability (finite and >= 0)"));
    }
    total += static_cast<double>(p);
  }
  if (!(total > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the row of ", probs.size(), " probabilities has no positive entry to sample"));
  }
  return total;
}

// Position in `probs` of the draw; the row is already validated.
size_t InverseCdfPosition(std::span<const float> probs, double total, double u) {
  const double target = u * total;
  double cumulative = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    // Same additions in the same order as RowTotal, so the final cumulative equals total.
    cumulative += static_cast<double>(probs[i]);
    if (target < cumulative) return i;
    if (probs[i] > 0.0f) last_positive = i;
  }
  // Unreachable while u < 1 (then u * total < total); kept so rounding can never select a
  // zero-probability token.
  return last_positive;
}

}  // namespace

absl::StatusOr<int32_t> SampleInverseCdf(std::span<const float> probs, double u) {
  if (auto status = CheckUniform(u); !status.ok()) return status;
  if (probs.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("row has ", probs.size(), " entries, more than int32 token ids can name"));
  }
  const absl::StatusOr<double> total = RowTotal(probs);
  if (!total.ok()) return total.status();
  return static_cast<int32_t>(InverseCdfPosition(probs, *total, u));
}

absl::StatusOr<int32_t> SampleInverseCdfSparse(std::span<const int32_t> ids,
                                               std::span<const float> probs, double u) {
  if (auto status = CheckUniform(u); !status.ok()) return status;
  if (ids.size() != probs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse row has ", ids.size(), " ids but ", probs.size(), " probabilities"));
  }
  for (size_t j = 0; j < ids.size(); ++j) {
    if (ids[j] < 0 || (j > 0 && ids[j] <= ids[j - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse row ids must be >= 0 and strictly ascending; ids[", j,
                       "] = ", ids[j], (j > 0 ? absl::StrCat(" follows ", ids[j - 1]) : "")));
    }
  }
  const absl::StatusOr<double> total = RowTotal(probs);
  if (!total.ok()) return total.status();
  return ids[InverseCdfPosition(probs, *total, u)];
}

ProbRow ExtractSupport(std::span<const float> probs) {
  ProbRow row;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0f) {
      row.ids.push_back(static_cast<int32_t>(i));
      row.probs.push_back(probs[i]);
    }
  }
  return row;
}

ProbRow CompactRow(std::span<const float> probs) {
  ProbRow row = ExtractSupport(probs);
  if (row.ids.size() * 2 > probs.size()) {
    row.ids.clear();
    row.probs.assign(probs.begin(), probs.end());
  }
  return row;
}

absl::StatusOr<std::vector<float>> DensifyRow(const ProbRow& row, int64_t vocab,
                                              std::string_view what) {
  const absl::string_view name(what.data(), what.size());
  if (row.dense()) {
    if (static_cast<int64_t>(row.probs.size()) != vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " row has ", row.probs.size(), " entries, expected ", vocab));
    }
    return row.probs;
  }
  if (row.ids.size() != row.probs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " row: ", row.ids.size(), " ids but ",
                                                   row.probs.size(), " probabilities"));
  }
  std::vector<float> dense(static_cast<size_t>(vocab), 0.0f);
  for (size_t i = 0; i < row.ids.size(); ++i) {
    if (row.ids[i] < 0 || row.ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " row: id ", row.ids[i], " outside [0, ", vocab, ")"));
    }
    dense[static_cast<size_t>(row.ids[i])] = row.probs[i];
  }
  return dense;
}

}  // namespace specd
