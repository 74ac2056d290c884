#include "services/coordinator/egag.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace specd {

absl::Status ValidateEgagOptions(const EgagOptions& o) {
  // Written as !(in range) so that NaN is rejected too.
  if (!(o.ema_beta >= 0.0 && o.ema_beta < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--egag-ema-beta must be in [0, 1), got ", o.ema_beta));
  }
  if (!(o.threshold >= 0.0 && o.threshold <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--egag-threshold must be in [0, 1], got ", o.threshold));
  }
  if (o.min_tokens < 1 || o.min_tokens > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--egag-min-tokens must be in [1, 64], got ", o.min_tokens));
  }
  return absl::OkStatus();
}

int32_t EgagState::DraftLength(int32_t k_max) const {
  if (!enabled || k_max <= options.min_tokens) return k_max;
  const double span = static_cast<double>(k_max - options.min_tokens);
  const auto gamma = static_cast<int32_t>(std::lround(k_max - span * h));
  return std::clamp(gamma, options.min_tokens, k_max);
}

void EgagState::Observe(std::span<const float> committed_entropies) {
  for (const float e : committed_entropies) {
    h = options.ema_beta * h + (1.0 - options.ema_beta) * static_cast<double>(e);
  }
}

}  // namespace specd
