// Speculation rounds over in-process workers: greedy speculative output equals plain decoding
// token for token for every K, on synthetic pairs of different agreement; sampled rounds keep the
// workers' caches consistent and return every KV block.
#include "services/coordinator/speculation_round.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "common/engine/decode_loop.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

std::unique_ptr<LocalWorker> MakeWorker(const std::filesystem::path& dir, int64_t exit_layer) {
  auto engine = testing::MakeEngine(dir, 1, /*kv_tokens=*/4096, exit_layer);
  if (engine == nullptr) return nullptr;
  WorkerRuntimeOptions options;
  options.prefill_chunk = 16;  // exercise chunked catch-up
  return std::make_unique<LocalWorker>(std::make_unique<WorkerRuntime>(std::move(engine), options));
}

// Generates `max_new` tokens for every sequence in `seqs` together, round after round.
void Generate(WorkerApi& draft, WorkerApi& target, std::vector<SpeculativeSequence>& seqs,
              int64_t max_new, int64_t max_seq_len, int* rounds_with_rejection = nullptr,
              int* plain_rounds = nullptr) {
  std::vector<size_t> target_len;
  for (const SpeculativeSequence& s : seqs) target_len.push_back(s.tokens.size() + max_new);
  while (true) {
    std::vector<SpeculativeSequence*> running;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].tokens.size() < target_len[i]) running.push_back(&seqs[i]);
    }
    if (running.empty()) break;
    const std::vector<RoundStats> stats =
        RunSpeculationRound(draft, target, running, RoundOptions{max_seq_len});
    for (const RoundStats& st : stats) {
      ASSERT_TRUE(st.status.ok()) << st.status;
      if (rounds_with_rejection != nullptr && st.accepted < st.drafted) ++*rounds_with_rejection;
      if (plain_rounds != nullptr && st.drafted == 0) ++*plain_rounds;
    }
  }
  // The last round may overshoot by up to K tokens; a server drops them the same way.
  for (SpeculativeSequence& s : seqs) {
    EXPECT_LE(s.tokens.size(), static_cast<size_t>(max_seq_len));
    s.tokens.resize(std::min(s.tokens.size(), static_cast<size_t>(s.prompt_len + max_new)));
  }
}

class GreedyParityTest : public ::testing::TestWithParam<double> {};

TEST_P(GreedyParityTest, SpeculativeEqualsPlainForEveryK) {
  ScopedTempDir dir;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  spec.config.num_layers = 4;
  spec.config.max_position_embeddings = 128;
  spec.residual_scale = GetParam();
  spec.seed = 21;
  testing::WriteSynth(spec, dir.path());
  auto plain_engine = testing::MakeEngine(dir.path(), 1);
  ASSERT_NE(plain_engine, nullptr);

  constexpr int kPrompts = 30;
  constexpr int64_t kNew = 24;
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < kPrompts; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 1 + p % 7; ++j) prompt.push_back(3 + (p * 31 + j * 17) % 290);
    DecodeRequest req;
    req.prompt = prompt;
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = kNew;
    absl::StatusOr<DecodeResult> out = DecodePlain(*plain_engine, 1, req);
    ASSERT_TRUE(out.ok()) << out.status();
    prompts.push_back(prompt);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), out->tokens.begin(), out->tokens.end());
    expected.push_back(full);
  }

  for (const int32_t K : {0, 1, 2, 4, 8}) {
    auto target = MakeWorker(dir.path(), 0);
    auto draft = MakeWorker(dir.path(), 1);
    ASSERT_NE(target, nullptr);
    ASSERT_NE(draft, nullptr);
    std::vector<SpeculativeSequence> seqs(kPrompts);
    for (int p = 0; p < kPrompts; ++p) {
      seqs[p].id = 100 + p;
      seqs[p].tokens = prompts[p];
      seqs[p].prompt_len = static_cast<int64_t>(prompts[p].size());
      seqs[p].sampling.temperature = 0.0f;
      seqs[p].num_speculative_tokens = K;
    }
    int rejections = 0;
    Generate(*draft, *target, seqs, kNew, 128, &rejections);
    for (int p = 0; p < kPrompts; ++p) {
      EXPECT_EQ(seqs[p].tokens, expected[p]) << "prompt " << p << ", K = " << K;
    }
    if (K > 0) {
      EXPECT_GT(rejections, 0) << "the draft never disagreed: the test would be vacuous";
    }
    for (auto& s : seqs) {
      ASSERT_TRUE(target->Release(s.id).ok());
      if (K > 0) {
        ASSERT_TRUE(draft->Release(s.id).ok());
      }
    }
    EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
    EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0);
  }
}

// s = 0.05: a draft that mostly agrees; s = 0.6: one that mostly does not.
INSTANTIATE_TEST_SUITE_P(Agreement, GreedyParityTest, ::testing::Values(0.05, 0.6));

TEST(SpeculationRoundTest, NearMaxSeqLenKShrinksToZero) {
  SpeculativeSequence s;
  s.tokens.assign(10, 1);
  s.num_speculative_tokens = 4;
  EXPECT_EQ(EffectiveK(s, 20), 4);
  EXPECT_EQ(EffectiveK(s, 13), 2);
  EXPECT_EQ(EffectiveK(s, 11), 0);
  EXPECT_EQ(EffectiveK(s, 10), 0);
}

TEST(SpeculationRoundTest, KShrinksToTheTokensTheRequestStillNeeds) {
  SpeculativeSequence s;
  s.tokens.assign(10, 1);
  s.num_speculative_tokens = 4;
  s.done_len = 15;  // 5 tokens to go: 4 drafts and the bonus fit
  EXPECT_EQ(EffectiveK(s, 100), 4);
  s.done_len = 12;  // 2 to go: one draft and the bonus
  EXPECT_EQ(EffectiveK(s, 100), 1);
  s.done_len = 11;  // the last token is plain decoding
  EXPECT_EQ(EffectiveK(s, 100), 0);
  s.done_len = 14;  // the tighter of the two ends wins
  EXPECT_EQ(EffectiveK(s, 13), 2);
}

// The phase times feed the benchmark's T_d, T_v(K) and overhead: the workers' forward passes lie
// inside the phases that contain them, and the token counts are what the workers were sent.
TEST(SpeculationRoundTest, PhaseTimesNestAndCountTheWork) {
  ScopedTempDir dir;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  testing::WriteSynth(spec, dir.path());
  auto target = MakeWorker(dir.path(), 0);
  auto draft = MakeWorker(dir.path(), 1);
  std::vector<SpeculativeSequence> seqs(2);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].id = i + 1;
    seqs[i].tokens = {1, 5, 6, static_cast<int32_t>(10 + i)};
    seqs[i].prompt_len = 4;
    seqs[i].num_speculative_tokens = 3;
  }
  std::vector<SpeculativeSequence*> batch = {&seqs[0], &seqs[1]};
  for (int round = 0; round < 3; ++round) {
    std::vector<int64_t> target_cached;
    for (const SpeculativeSequence& s : seqs) {
      target_cached.push_back(static_cast<int64_t>(s.tokens.size()) - s.target_cached);
    }
    RoundPhaseTimes t;
    const std::vector<RoundStats> stats =
        RunSpeculationRound(*draft, *target, batch, RoundOptions{256, &t});
    for (const RoundStats& st : stats) ASSERT_TRUE(st.status.ok()) << st.status;
    EXPECT_EQ(t.draft_steps, 3);  // one batched forward pass per draft position
    EXPECT_EQ(t.verify_tokens, target_cached[0] + target_cached[1] + 2 * 3);
    EXPECT_GT(t.draft_forward, absl::ZeroDuration());
    EXPECT_GT(t.verify_forward, absl::ZeroDuration());
    EXPECT_LE(t.draft_forward, t.draft);
    EXPECT_LE(t.verify_forward, t.verify);
    EXPECT_GE(t.round, t.draft + t.verify + t.accept + t.truncate);
  }
  for (const auto& s : seqs) {
    ASSERT_TRUE(target->Release(s.id).ok());
    ASSERT_TRUE(draft->Release(s.id).ok());
  }
}

TEST(SpeculationRoundTest, SampledRoundsRunToTheLimitAndFreeEverything) {
  ScopedTempDir dir;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  spec.config.max_position_embeddings = 64;
  spec.residual_scale = 0.3;
  testing::WriteSynth(spec, dir.path());
  auto target = MakeWorker(dir.path(), 0);
  auto draft = MakeWorker(dir.path(), 1);
  std::vector<SpeculativeSequence> seqs(6);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].id = i + 1;
    seqs[i].tokens = {1, static_cast<int32_t>(10 + i)};
    seqs[i].prompt_len = 2;
    seqs[i].seed = 1234 + i;
    seqs[i].sampling.temperature = 1.0f;
    seqs[i].sampling.top_k = i % 2 == 0 ? 0 : 20;
    seqs[i].sampling.top_p = i % 3 == 0 ? 1.0f : 0.8f;
    seqs[i].num_speculative_tokens = static_cast<int32_t>(1 + i);
    seqs[i].num_candidates = static_cast<int32_t>(i % 3);  // M = 0 forces the ReadRows fallback
  }
  // Up to the model's limit: the last rounds run with a shrinking K and then K = 0.
  int plain_rounds = 0;
  Generate(*draft, *target, seqs, 62, 64, nullptr, &plain_rounds);
  EXPECT_GT(plain_rounds, 0);
  for (const auto& s : seqs) {
    ASSERT_TRUE(target->Release(s.id).ok());
    ASSERT_TRUE(draft->Release(s.id).ok());
  }
  EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
  EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0);
}

}  // namespace
}  // namespace specd
