#include "base/sampling_params.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string Error(const SamplingParams& p, int64_t vocab = 32000) {
  const absl::Status status = ValidateSamplingParams(p, vocab);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(ValidateSamplingParamsTest, DefaultsAndBoundariesAreValid) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}, 32000).ok());
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 1 << 30;  // beyond the vocabulary: keeps everything
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.repetition_penalty = 1e-3f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  EXPECT_TRUE(ValidateSamplingParams(p, 1).ok());
  EXPECT_TRUE(p.greedy());
  p.top_p = 1e-6f;
  p.min_p = 0.0f;
  p.presence_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  EXPECT_TRUE(ValidateSamplingParams(p, 128256).ok());
}

TEST(ValidateSamplingParamsTest, MessagesNameTheFieldAndValue) {
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_THAT(Error(p), HasSubstr("temperature must be >= 0, got -1"));
  p = {};
  p.temperature = std::nanf("");
  EXPECT_THAT(Error(p), HasSubstr("temperature must be a finite number, got nan"));
  p = {};
  p.temperature = kInf;
  EXPECT_THAT(Error(p), HasSubstr("temperature must be a finite number"));
  p = {};
  p.top_k = -1;
  EXPECT_THAT(Error(p), HasSubstr("top_k must be >= 0 (0 disables it), got -1"));
  p = {};
  p.top_p = 0.0f;
  EXPECT_THAT(Error(p), HasSubstr("top_p must be in (0, 1], got 0"));
  p.top_p = 1.5f;
  EXPECT_THAT(Error(p), HasSubstr("top_p must be in (0, 1], got 1.5"));
  p.top_p = std::nanf("");
  EXPECT_THAT(Error(p), HasSubstr("top_p must be a finite number"));
  p = {};
  p.min_p = -0.1f;
  EXPECT_THAT(Error(p), HasSubstr("min_p must be in [0, 1], got -0.1"));
  p.min_p = std::nanf("");
  EXPECT_THAT(Error(p), HasSubstr("min_p must be a finite number"));
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_THAT(Error(p), HasSubstr("repetition_penalty must be > 0 (1 disables it), got 0"));
  p.repetition_penalty = -kInf;
  EXPECT_THAT(Error(p), HasSubstr("repetition_penalty must be a finite number"));
  p = {};
  p.presence_penalty = 2.5f;
  EXPECT_THAT(Error(p), HasSubstr("presence_penalty must be in [-2, 2], got 2.5"));
  p = {};
  p.frequency_penalty = -3.0f;
  EXPECT_THAT(Error(p), HasSubstr("frequency_penalty must be in [-2, 2], got -3"));
  p.frequency_penalty = std::nanf("");
  EXPECT_THAT(Error(p), HasSubstr("frequency_penalty must be a finite number"));
}

TEST(ValidateSamplingParamsTest, VocabSizeMustFitInt32Ids) {
  EXPECT_THAT(Error(SamplingParams{}, 0),
              HasSubstr("vocab_size must be in [1, 2147483647], got 0"));
  EXPECT_THAT(Error(SamplingParams{}, int64_t{1} << 31), HasSubstr("vocab_size"));
}

}  // namespace
}  // namespace specd
