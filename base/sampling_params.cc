#include "base/sampling_params.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace specd {
namespace {

absl::Status NotFinite(absl::string_view field, float value) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling parameter ", field, " must be a finite number, got ", value));
}

absl::Status OutOfRange(absl::string_view field, absl::string_view range, float value) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling parameter ", field, " must be ", range, ", got ", value));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be in [1, 2147483647], got ", vocab_size));
  }
  if (!std::isfinite(p.temperature)) return NotFinite("temperature", p.temperature);
  if (p.temperature < 0.0f) return OutOfRange("temperature", ">= 0", p.temperature);
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling parameter top_k must be >= 0 (0 disables it), got ", p.top_k));
  }
  if (!std::isfinite(p.top_p)) return NotFinite("top_p", p.top_p);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return OutOfRange("top_p", "in (0, 1]", p.top_p);
  if (!std::isfinite(p.min_p)) return NotFinite("min_p", p.min_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return OutOfRange("min_p", "in [0, 1]", p.min_p);
  if (!std::isfinite(p.repetition_penalty)) {
    return NotFinite("repetition_penalty", p.repetition_penalty);
  }
  if (!(p.repetition_penalty > 0.0f)) {
    return OutOfRange("repetition_penalty", "> 0 (1 disables it)", p.repetition_penalty);
  }
  if (!std::isfinite(p.presence_penalty)) return NotFinite("presence_penalty", p.presence_penalty);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return OutOfRange("presence_penalty", "in [-2, 2]", p.presence_penalty);
  }
  if (!std::isfinite(p.frequency_penalty)) {
    return NotFinite("frequency_penalty", p.frequency_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return OutOfRange("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
  }
  return absl::OkStatus();
}

absl::Status ValidateLogitBias(std::span<const TokenBias> bias, int64_t vocab_size) {
  if (static_cast<int64_t>(bias.size()) > kMaxLogitBiasTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logit_bias has ", bias.size(), " tokens; at most ", kMaxLogitBiasTokens, " are allowed"));
  }
  for (size_t i = 0; i < bias.size(); ++i) {
    const TokenBias& b = bias[i];
    if (b.token < 0 || b.token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token ", b.token, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (i > 0 && b.token <= bias[i - 1].token) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias tokens must be ascending and distinct; token ", b.token,
                       " follows ", bias[i - 1].token));
    }
    if (!std::isfinite(b.bias) || b.bias < -kMaxLogitBias || b.bias > kMaxLogitBias) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias of token ", b.token, " must be a number in [-100, 100], got ", b.bias));
    }
  }
  return absl::OkStatus();
}

}  // namespace specd
