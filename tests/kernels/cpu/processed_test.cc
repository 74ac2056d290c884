#include "kernels/cpu/processed.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specd::kernels::cpu {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Tolerance against the numpy reference. Both sides round the same fp32 operations except exp
// (ours is a polynomial within 1 ulp, numpy's another approximation) and the order of the fp64
// sums, so a probability differs by a few 1e-7 relative at most; 1e-5 leaves room and is still
// far below anything a filter bug would produce. kAbsTol only matters for subnormal
// probabilities, where fp32 keeps fewer digits.
constexpr double kRelTol = 1e-5;
constexpr double kAbsTol = 1e-37;

template <typename T>
std::vector<T> ReadBinary(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

SamplingParams ParamsFromJson(const nlohmann::json& j) {
  SamplingParams p;
  p.temperature = static_cast<float>(j.at("temperature").get<double>());
  p.top_k = j.at("top_k").get<int32_t>();
  p.top_p = static_cast<float>(j.at("top_p").get<double>());
  p.min_p = static_cast<float>(j.at("min_p").get<double>());
  p.repetition_penalty = static_cast<float>(j.at("repetition_penalty").get<double>());
  p.presence_penalty = static_cast<float>(j.at("presence_penalty").get<double>());
  p.frequency_penalty = static_cast<float>(j.at("frequency_penalty").get<double>());
  return p;
}

TEST(ProcessedDistributionTest, MatchesIndependentNumpyReference) {
  const std::filesystem::path python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) {
    GTEST_SKIP() << "/usr/bin/python3 (with numpy) runs the reference; it is not installed here";
  }
  const std::filesystem::path script =
      testing::SourceDir() / "tests/kernels/cpu/processed_reference.py";
  ASSERT_TRUE(std::filesystem::exists(script)) << script;
  const testing::ScopedTempDir dir;
  const std::string command =
      python.string() + " '" + script.string() + "' '" + dir.path().string() + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << "reference failed: " << command;

  std::ifstream manifest_in(dir.path() / "cases.json");
  const nlohmann::json manifest = nlohmann::json::parse(manifest_in, nullptr, false);
  ASSERT_FALSE(manifest.is_discarded());
  const std::vector<float> logits_all = ReadBinary<float>(dir.path() / "logits.f32");
  const std::vector<float> expected_all = ReadBinary<float>(dir.path() / "expected.f32");
  const std::vector<uint8_t> kept_all = ReadBinary<uint8_t>(dir.path() / "kept.u8");
  ASSERT_EQ(logits_all.size(), expected_all.size());
  ASSERT_EQ(logits_all.size(), kept_all.size());

  // One processor for every case, as a worker would use it: scratch left by one row must not
  // leak into the next.
  LogitsProcessor processor;
  int64_t cases = 0;
  for (const nlohmann::json& c : manifest.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const size_t vocab = c.at("vocab").get<size_t>();
    const size_t offset = c.at("offset").get<size_t>();
    ASSERT_LE(offset + vocab, logits_all.size());
    const std::span<const float> logits(logits_all.data() + offset, vocab);
    const std::span<const float> expected(expected_all.data() + offset, vocab);
    const std::span<const uint8_t> kept(kept_all.data() + offset, vocab);
    const SamplingParams params = ParamsFromJson(c.at("params"));
    const std::vector<int32_t> prompt = c.at("prompt").get<std::vector<int32_t>>();
    const std::vector<int32_t> output = c.at("output").get<std::vector<int32_t>>();
    std::vector<TokenBias> bias;
    for (const nlohmann::json& b : c.at("bias")) {
      bias.push_back({b.at(0).get<int32_t>(), static_cast<float>(b.at(1).get<double>())});
    }
    const TokenHistory history{prompt, output, bias};

    std::vector<float> probs(vocab, -1.0f);
    ASSERT_TRUE(processor.ProcessedDistribution(logits, params, history, probs).ok());

    double sum = 0.0;
    for (size_t i = 0; i < vocab; ++i) {
      if (!kept[i]) {
        // A filtered token gets exactly 0, not merely a small number.
        ASSERT_EQ(probs[i], 0.0f) << "token " << i << " was filtered by the reference";
        continue;
      }
      const double want = expected[i];
      // The supports agree exactly: the exp flush is decided on w - m, which both compute
      // bit-identically, and no kept probability is small enough to underflow to 0.
      ASSERT_EQ(probs[i] > 0.0f, want > 0.0) << "token " << i << " want " << want;
      ASSERT_NEAR(probs[i], want, kRelTol * want + kAbsTol) << "token " << i;
      sum += probs[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);

    // Bit-identical from a fresh processor and from the one-shot form.
    std::vector<float> again(vocab);
    ASSERT_TRUE(ProcessedDistribution(logits, params, history, again).ok());
    EXPECT_EQ(again, probs);

    const absl::StatusOr<int32_t> greedy = processor.GreedyToken(logits, params, history);
    ASSERT_TRUE(greedy.ok()) << greedy.status();
    EXPECT_EQ(*greedy, c.at("greedy_token").get<int32_t>());
    ++cases;
  }
  EXPECT_GE(cases, 100);
}

TEST(ExpForSoftmaxTest, WithinOneUlpOfExpAndFlushedBelowTheThreshold) {
  // About two million floats spread evenly (by bit pattern) over [-87, 0], against fp64 exp
  // measured in ulps of the nearest float.
  const uint32_t from = std::bit_cast<uint32_t>(-0.0f);
  const uint32_t to = std::bit_cast<uint32_t>(kExpFlushBelow);
  double worst_ulp = 0.0;
  float worst_x = 0.0f;
  for (uint64_t bits = from; bits <= to; bits += 541) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    const double want = std::exp(static_cast<double>(x));
    const float nearest = static_cast<float>(want);
    const double ulp = std::nextafter(nearest, kInf) - nearest;
    const double err = std::abs(static_cast<double>(ExpForSoftmax(x)) - want) / ulp;
    if (err > worst_ulp) {
      worst_ulp = err;
      worst_x = x;
    }
  }
  EXPECT_LE(worst_ulp, 1.0) << "at x = " << worst_x;
  EXPECT_EQ(ExpForSoftmax(0.0f), 1.0f);
  EXPECT_EQ(ExpForSoftmax(-0.0f), 1.0f);
  EXPECT_GT(ExpForSoftmax(kExpFlushBelow), 0.0f);
  EXPECT_EQ(ExpForSoftmax(std::nextafter(kExpFlushBelow, -kInf)), 0.0f);
  EXPECT_EQ(ExpForSoftmax(-1000.0f), 0.0f);
  EXPECT_EQ(ExpForSoftmax(-kInf), 0.0f);
}

TEST(ProcessedDistributionTest, RepetitionPenaltyByHand) {
  // 2 -> 2 / 2 = 1 and -2 -> -2 * 2 = -4 (divide positives, multiply the rest), so token 2
  // (1.5, not in the history) becomes the argmax.
  const std::vector<float> logits = {2.0f, -2.0f, 1.5f};
  const std::vector<int32_t> prompt = {0, 1, 0};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(*GreedyToken(logits, p, {prompt, {}}), 2);
  p.repetition_penalty = 1.0f;
  EXPECT_EQ(*GreedyToken(logits, p, {prompt, {}}), 0);

  // With temperature 1 and no filter the row is the softmax of (1, -4, 1.5).
  p.repetition_penalty = 2.0f;
  std::vector<float> probs(3);
  ASSERT_TRUE(ProcessedDistribution(logits, p, {prompt, {}}, probs).ok());
  const double z = std::exp(1.0) + std::exp(-4.0) + std::exp(1.5);
  EXPECT_NEAR(probs[0], std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(probs[1], std::exp(-4.0) / z, 1e-6);
  EXPECT_NEAR(probs[2], std::exp(1.5) / z, 1e-6);
}

TEST(ProcessedDistributionTest, FrequencyCountsAndPresenceOnlyOutput) {
  const std::vector<float> logits = {1.0f, 0.9f};
  const std::vector<int32_t> output = {0, 0};
  SamplingParams p;
  // Frequency 0.1 twice: 1.0 - 0.2 = 0.8 < 0.9.
  p.frequency_penalty = 0.1f;
  EXPECT_EQ(*GreedyToken(logits, p, {{}, output}), 1);
  // Presence counts once: 1.0 - 0.05 = 0.95 > 0.9.
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.05f;
  EXPECT_EQ(*GreedyToken(logits, p, {{}, output}), 0);
  // Presence and frequency ignore the prompt.
  p.presence_penalty = 2.0f;
  p.frequency_penalty = 2.0f;
  EXPECT_EQ(*GreedyToken(logits, p, {output, {}}), 0);
}

TEST(ProcessedDistributionTest, GreedyRowIsOneHotAtGreedyToken) {
  const std::vector<float> logits = {0.5f, 3.0f, 3.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  std::vector<float> probs(4);
  ASSERT_TRUE(ProcessedDistribution(logits, p, {}, probs).ok());
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(*GreedyToken(logits, p, {}), 1);
}

TEST(ProcessedDistributionTest, InPlaceEqualsOutOfPlace) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i) * 4.0f;
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 100;
  p.top_p = 0.9f;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.2f;
  const std::vector<int32_t> history = {5, 17, 17, 999};
  std::vector<float> out(logits.size());
  ASSERT_TRUE(ProcessedDistribution(logits, p, {history, history}, out).ok());
  std::vector<float> in_place = logits;
  ASSERT_TRUE(ProcessedDistribution(in_place, p, {history, history}, in_place).ok());
  EXPECT_EQ(in_place, out);
}

TEST(ProcessedDistributionTest, LargeVocabularyTopKKeepsExactlyK) {
  constexpr size_t kVocab = 128256;
  std::vector<float> logits(kVocab);
  for (size_t i = 0; i < kVocab; ++i) logits[i] = std::sin(1.3f * i) * 3.0f;
  SamplingParams p;
  p.top_k = 50;
  std::vector<float> probs(kVocab);
  LogitsProcessor processor;
  ASSERT_TRUE(processor.ProcessedDistribution(logits, p, {}, probs).ok());
  // The kept set is the 50 largest logits: every kept logit >= every removed one.
  float min_kept = kInf;
  float max_removed = -kInf;
  int64_t kept = 0;
  for (size_t i = 0; i < kVocab; ++i) {
    if (probs[i] > 0.0f) {
      ++kept;
      min_kept = std::min(min_kept, logits[i]);
    } else {
      max_removed = std::max(max_removed, logits[i]);
    }
  }
  EXPECT_EQ(kept, 50);
  EXPECT_GE(min_kept, max_removed);
}

TEST(ProcessedDistributionTest, RejectsNanLogit) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, std::nanf(""), 4.0f};
  std::vector<float> probs(logits.size());
  const absl::Status status = ProcessedDistribution(logits, SamplingParams{}, {}, probs);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("logits[3] is NaN"));
  EXPECT_EQ(GreedyToken(logits, SamplingParams{}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessedDistributionTest, RejectsHistoryOutsideVocabularyOnlyWhenUsed) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const std::vector<int32_t> output = {1, 3};
  std::vector<float> probs(3);
  SamplingParams p;
  EXPECT_TRUE(ProcessedDistribution(logits, p, {{}, output}, probs).ok());
  p.presence_penalty = 0.5f;
  const absl::Status status = ProcessedDistribution(logits, p, {{}, output}, probs);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("history.output[1] = 3"));
  EXPECT_THAT(status.message(), HasSubstr("[0, 3)"));

  const std::vector<int32_t> prompt = {-1};
  p = SamplingParams{};
  p.repetition_penalty = 1.1f;
  EXPECT_THAT(GreedyToken(logits, p, {prompt, {}}).status().message(),
              HasSubstr("history.prompt[0] = -1"));
}

TEST(ProcessedDistributionTest, RejectsBadParamsAndSizes) {
  const std::vector<float> logits = {0.0f, 1.0f};
  std::vector<float> probs(2);
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THAT(ProcessedDistribution(logits, p, {}, probs).message(), HasSubstr("top_p"));
  std::vector<float> short_out(1);
  EXPECT_THAT(ProcessedDistribution(logits, SamplingParams{}, {}, short_out).message(),
              HasSubstr("probs_out has 1 entries but logits has 2"));
  EXPECT_EQ(ProcessedDistribution({}, SamplingParams{}, {}, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessedDistributionTest, AllBannedRowHasNoDistribution) {
  const std::vector<float> logits = {-kInf, -kInf, -kInf};
  std::vector<float> probs(3);
  const absl::Status status = ProcessedDistribution(logits, SamplingParams{}, {}, probs);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("-inf"));
  // Top-k can leave only banned tokens too.
  const std::vector<float> one_left = {-kInf, 2.0f, -kInf};
  SamplingParams p;
  p.top_k = 1;
  EXPECT_TRUE(ProcessedDistribution(one_left, p, {}, probs).ok());
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f, 0.0f}));
  // The argmax of an all -inf row is still defined: the lowest id.
  EXPECT_EQ(*GreedyToken(logits, SamplingParams{}, {}), 0);
}

}  // namespace
}  // namespace specd::kernels::cpu
