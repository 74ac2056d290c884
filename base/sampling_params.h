// Per-request sampling parameters, with the ranges vLLM and the OpenAI API accept.
#ifndef SPECD_BASE_SAMPLING_PARAMS_H_
#define SPECD_BASE_SAMPLING_PARAMS_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace specd {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = disabled; >= vocab size keeps everything
  float top_p = 1.0f;               // (0, 1]; 1 = disabled
  float min_p = 0.0f;               // [0, 1]; 0 = disabled
  float repetition_penalty = 1.0f;  // > 0; 1 = off. Over prompt + output.
  float presence_penalty = 0.0f;    // [-2, 2] like OpenAI/vLLM. Over output only.
  float frequency_penalty = 0.0f;   // [-2, 2]. Over output only.

  bool greedy() const { return temperature == 0.0f; }
  // Whether the processed row depends on the tokens so far (a penalty is on).
  bool penalizes() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  bool operator==(const SamplingParams&) const = default;
};

// OpenAI's logit_bias: `bias` is added to the token's logit before anything else of the
// processed distribution (before the penalties, as in vLLM). -100 in effect bans a token.
struct TokenBias {
  int32_t token = 0;
  float bias = 0.0f;
  bool operator==(const TokenBias&) const = default;
};
inline constexpr float kMaxLogitBias = 100.0f;  // |bias| at most, as OpenAI allows
inline constexpr int64_t kMaxLogitBiasTokens = 1024;

// OK, or INVALID_ARGUMENT naming the first bad field and its value, e.g.
// "temperature must be >= 0, got -1". NaN and infinities are rejected everywhere; vocab_size
// must be in [1, 2^31 - 1] because token ids are int32.
absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size);

// OK for at most kMaxLogitBiasTokens entries in ascending token order (each token once), each
// token in [0, vocab_size) and each bias finite in [-kMaxLogitBias, kMaxLogitBias]; otherwise
// INVALID_ARGUMENT naming the entry, e.g. "logit_bias token 32000 is outside the vocabulary
// [0, 32000)".
absl::Status ValidateLogitBias(std::span<const TokenBias> bias, int64_t vocab_size);

}  // namespace specd

#endif  // SPECD_BASE_SAMPLING_PARAMS_H_
