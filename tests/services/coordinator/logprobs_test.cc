// Exact logprobs and n completions (issue 15), over in-process workers:
//  * greedy logprobs are the same bits for every K (the draft never leaks in);
//  * every reported logprob matches an independent numpy reference of the target alone
//    (logprobs_reference.py), raw and processed, greedy and sampled, including the tokens the
//    residual fallback (ReadRows) picks, which Verify could not report;
//  * top logprobs are sorted and hold the emitted token where it belongs;
//  * completions of one seed with different sample numbers are reproducible and independent:
//    each has the target's distribution (chi-square), and two agree only as often as two
//    independent draws would (a z-test with power against ignoring the sample number).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/local_worker.h"
#include "services/coordinator/speculation_round.h"
#include "tests/base/chi_square.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

// The C++ forward pass runs in fp32 and the reference in fp64: logits differ in the fifth
// significant digit, and so do their logprobs.
constexpr double kTolerance = 2e-4;
constexpr double kAlpha = 1e-4;

std::unique_ptr<LocalWorker> MakeWorker(const std::filesystem::path& dir, int64_t exit_layer) {
  auto engine = testing::MakeEngine(dir, 1, /*kv_tokens=*/8192, exit_layer);
  if (engine == nullptr) return nullptr;
  return std::make_unique<LocalWorker>(
      std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A generated sequence and its tokens' logprobs.
struct Generated {
  std::vector<int32_t> tokens;  // generated only
  std::vector<TokenLogprobs> logprobs;
  int read_rows = 0;  // rounds whose correction came from the ReadRows fallback
  int rejections = 0;
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;  // when the sequence asked
  int scoring_rounds = 0;  // rounds that read the prompt as forced chains
};

// Runs `seqs` to `max_new` tokens each, round after round, collecting what each round emitted.
std::vector<Generated> Generate(WorkerApi& draft, WorkerApi& target,
                                std::vector<SpeculativeSequence>& seqs, size_t max_new,
                                const RoundOptions& options = RoundOptions{1 << 20}) {
  std::vector<Generated> runs(seqs.size());
  while (true) {
    std::vector<SpeculativeSequence*> running;
    std::vector<size_t> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (runs[i].tokens.size() < max_new) {
        running.push_back(&seqs[i]);
        which.push_back(i);
      }
    }
    if (running.empty()) break;
    std::vector<bool> scoring;
    for (const SpeculativeSequence* s : running) scoring.push_back(s->scoring());
    const std::vector<RoundStats> stats = RunSpeculationRound(draft, target, running, options);
    for (size_t b = 0; b < stats.size(); ++b) {
      const RoundStats& st = stats[b];
      EXPECT_TRUE(st.status.ok()) << st.status;
      if (!st.status.ok()) return runs;
      Generated& r = runs[which[b]];
      if (st.prompt_logprobs.has_value()) {
        EXPECT_FALSE(r.prompt_logprobs.has_value()) << "prompt logprobs reported twice";
        r.prompt_logprobs = st.prompt_logprobs;
      }
      r.scoring_rounds += scoring[b] && !st.deferred ? 1 : 0;
      EXPECT_EQ(st.logprobs.size(),
                running[b]->logprobs.mode == LogprobsMode::kOff ? 0u : st.appended.size());
      for (size_t j = 0; j < st.appended.size() && r.tokens.size() < max_new; ++j) {
        r.tokens.push_back(st.appended[j]);
        if (j < st.logprobs.size()) r.logprobs.push_back(st.logprobs[j]);
      }
      r.read_rows += st.used_read_rows;
      r.rejections += st.accepted < st.drafted;
    }
  }
  for (SpeculativeSequence& s : seqs) {
    EXPECT_TRUE(target.Release(s.id).ok());
    if (s.num_speculative_tokens > 0 && s.uses_draft_worker()) (void)draft.Release(s.id);
  }
  return runs;
}

class LogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.num_layers = 4;
    spec.config.max_position_embeddings = 256;
    // The 1-layer draft disagrees often enough that rounds end in rejections.
    spec.residual_scale = 0.5;
    spec.seed = 33;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  static SpeculativeSequence Seq(uint64_t id, std::vector<int32_t> prompt,
                                 const SamplingParams& sampling, int32_t K,
                                 LogprobsRequest logprobs, uint64_t seed = 7) {
    SpeculativeSequence s;
    s.id = id;
    s.tokens = std::move(prompt);
    s.prompt_len = static_cast<int64_t>(s.tokens.size());
    s.sampling = sampling;
    s.seed = seed;
    s.num_speculative_tokens = K;
    s.logprobs = logprobs;
    return s;
  }

  static std::vector<int32_t> Prompt(int p) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 2 + p % 5; ++j) prompt.push_back(3 + (p * 37 + j * 11) % 290);
    return prompt;
  }

  // The reference's raw and processed logprobs ([token][vocab]; -inf as such).
  struct Reference {
    std::vector<std::vector<double>> raw, processed;
  };
  static Reference RunReference(const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& output, const SamplingParams& p) {
    static int calls = 0;
    const std::filesystem::path in = dir_->path() / absl::StrCat("request", calls, ".json");
    const std::filesystem::path out = dir_->path() / absl::StrCat("reference", calls++, ".json");
    {
      std::ofstream f(in);
      f << nlohmann::json({{"prompt", prompt},
                           {"output", output},
                           {"params",
                            {{"temperature", p.temperature},
                             {"top_k", p.top_k},
                             {"top_p", p.top_p},
                             {"min_p", p.min_p},
                             {"repetition_penalty", p.repetition_penalty},
                             {"presence_penalty", p.presence_penalty},
                             {"frequency_penalty", p.frequency_penalty}}}})
               .dump();
    }
    const std::string cmd = absl::StrCat(
        testing::Python(), " ",
        (testing::SourceDir() / "tests/services/coordinator/logprobs_reference.py").string(), " ",
        dir_->path().string(), " ", in.string(), " ", out.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);
    const nlohmann::json j = nlohmann::json::parse(f);
    Reference r;
    for (const char* key : {"raw", "processed"}) {
      auto& rows = std::string(key) == "raw" ? r.raw : r.processed;
      for (const auto& row : j[key]) {
        std::vector<double> v;
        for (const auto& x : row) {
          v.push_back(x.is_null() ? -INFINITY : x.get<double>());
        }
        rows.push_back(std::move(v));
      }
    }
    return r;
  }

  static inline ScopedTempDir* dir_ = nullptr;
};

TEST_F(LogprobsTest, GreedyLogprobsAreTheSameBitsForEveryK) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.repetition_penalty = 1.2f;  // the penalties shape the logprobs too
  greedy.presence_penalty = 0.3f;
  constexpr int kPrompts = 8;
  constexpr size_t kNew = 24;
  for (const LogprobsMode mode : {LogprobsMode::kRaw, LogprobsMode::kProcessed}) {
    std::vector<Generated> baseline;
    for (const int32_t K : {0, 1, 4, 8}) {
      auto target = MakeWorker(dir_->path(), 0);
      auto draft = MakeWorker(dir_->path(), 1);
      std::vector<SpeculativeSequence> seqs;
      for (int p = 0; p < kPrompts; ++p) {
        seqs.push_back(Seq(10 + p, Prompt(p), greedy, K, {mode, 5}));
      }
      const std::vector<Generated> runs = Generate(*draft, *target, seqs, kNew);
      int rejections = 0;
      for (const Generated& r : runs) rejections += r.rejections;
      if (K > 0) {
        EXPECT_GT(rejections, 0) << "the draft never disagreed: the test is vacuous";
      }
      if (K == 0) {
        baseline = runs;
        continue;
      }
      for (int p = 0; p < kPrompts; ++p) {
        ASSERT_EQ(runs[p].tokens, baseline[p].tokens) << "prompt " << p << ", K = " << K;
        ASSERT_EQ(runs[p].logprobs.size(), kNew);
        for (size_t j = 0; j < kNew; ++j) {
          const TokenLogprobs& a = runs[p].logprobs[j];
          const TokenLogprobs& b = baseline[p].logprobs[j];
          EXPECT_TRUE(SameBits(a.logprob, b.logprob))
              << "prompt " << p << " token " << j << " K = " << K << ": " << a.logprob << " vs "
              << b.logprob;
          EXPECT_EQ(a.top_ids, b.top_ids);
          ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
          for (size_t t = 0; t < a.top_logprobs.size(); ++t) {
            EXPECT_TRUE(SameBits(a.top_logprobs[t], b.top_logprobs[t]));
          }
        }
      }
      EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
      EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0);
    }
    // Greedy's processed distribution is one-hot: the emitted token has probability 1.
    if (mode == LogprobsMode::kProcessed) {
      for (const Generated& r : baseline) {
        for (const TokenLogprobs& lp : r.logprobs) EXPECT_EQ(lp.logprob, 0.0f);
      }
    } else {
      for (const Generated& r : baseline) {
        for (const TokenLogprobs& lp : r.logprobs) EXPECT_LT(lp.logprob, 0.0f);  // real values
      }
    }
  }
}

// Prompt logprobs (echo with logprobs): the target reads the prompt as forced chains of at most 64
// tokens, or what its pass budget leaves, and each token's logprob at its position equals the
// numpy reference of the target alone (raw, and processed at temperature 0.8 with top-k). Nothing
// else changes: the generated tokens and their logprobs are the same bits as without scoring.
TEST_F(LogprobsTest, PromptLogprobsMatchTheReferenceAndChangeNothingElse) {
  constexpr int32_t kTop = 4;
  constexpr size_t kNew = 12;
  // 150 tokens take three chains (64 + 64 + 21 after the first token); 1 token has nothing to
  // score.
  std::vector<std::vector<int32_t>> prompts = {Prompt(0), Prompt(3), {1}};
  std::vector<int32_t> long_prompt = {1};
  for (int j = 0; j < 149; ++j) long_prompt.push_back(3 + (j * 53) % 290);
  prompts.push_back(long_prompt);
  struct Setting {
    LogprobsMode mode;
    float temperature;
    int32_t top_k;
    int32_t K;
    int64_t target_pass_tokens;  // 0: no budget; 16: chains of 15
  };
  for (const Setting& set : {Setting{LogprobsMode::kRaw, 0.0f, 0, 4, 0},
                             Setting{LogprobsMode::kProcessed, 0.8f, 20, 4, 0},
                             Setting{LogprobsMode::kRaw, 1.0f, 0, 0, 16}}) {
    const std::string where = absl::StrCat("mode ", static_cast<int>(set.mode), " K ", set.K,
                                           " budget ", set.target_pass_tokens);
    SamplingParams p;
    p.temperature = set.temperature;
    p.top_k = set.top_k;
    RoundOptions options{1 << 20};
    options.target_pass_tokens = set.target_pass_tokens;
    std::vector<Generated> with, without;
    for (const bool score : {true, false}) {
      auto target = MakeWorker(dir_->path(), 0);
      auto draft = MakeWorker(dir_->path(), 1);
      std::vector<SpeculativeSequence> seqs;
      for (size_t i = 0; i < prompts.size(); ++i) {
        SpeculativeSequence s = Seq(300 + i, prompts[i], p, set.K, {set.mode, kTop}, 50 + i);
        if (score) s.prompt_logprobs = {set.mode, kTop};
        seqs.push_back(std::move(s));
      }
      (score ? with : without) = Generate(*draft, *target, seqs, kNew, options);
      EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0) << where;
      EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0) << where;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string seq = absl::StrCat(where, " prompt ", i);
      EXPECT_FALSE(without[i].prompt_logprobs.has_value()) << seq;
      ASSERT_TRUE(with[i].prompt_logprobs.has_value()) << seq;
      ASSERT_EQ(with[i].tokens, without[i].tokens) << seq;
      ASSERT_EQ(with[i].logprobs.size(), without[i].logprobs.size()) << seq;
      for (size_t j = 0; j < with[i].logprobs.size(); ++j) {
        EXPECT_TRUE(SameBits(with[i].logprobs[j].logprob, without[i].logprobs[j].logprob)) << seq;
      }
      const int64_t scored = static_cast<int64_t>(prompts[i].size()) - 1;
      const int64_t chain = set.target_pass_tokens > 0 ? set.target_pass_tokens - 1 : 64;
      EXPECT_EQ(with[i].scoring_rounds, (scored + chain - 1) / chain) << seq;
      const std::vector<TokenLogprobs>& got = *with[i].prompt_logprobs;
      ASSERT_EQ(static_cast<int64_t>(got.size()), scored) << seq;
      if (scored == 0) continue;
      const Reference ref = RunReference(
          {prompts[i][0]}, std::vector<int32_t>(prompts[i].begin() + 1, prompts[i].end()), p);
      const std::vector<std::vector<double>>& want =
          set.mode == LogprobsMode::kProcessed ? ref.processed : ref.raw;
      ASSERT_EQ(static_cast<int64_t>(want.size()), scored) << seq;
      for (size_t j = 0; j < got.size(); ++j) {
        const int32_t t = prompts[i][j + 1];
        const double w = want[j][static_cast<size_t>(t)];
        if (std::isinf(w)) {
          EXPECT_TRUE(std::isinf(got[j].logprob) && got[j].logprob < 0) << seq << " token " << j;
        } else {
          EXPECT_NEAR(got[j].logprob, w, kTolerance) << seq << " token " << j;
        }
        ASSERT_EQ(got[j].top_ids.size(), static_cast<size_t>(kTop)) << seq;
        std::vector<double> sorted = want[j];
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        EXPECT_NEAR(got[j].top_logprobs[0], sorted[0], kTolerance) << seq << " token " << j;
      }
    }
  }
}

// A target that loses the sequence mid-scoring (a restart) scores the lost part again: the
// prompt logprobs are reported once, with the reference's values.
TEST_F(LogprobsTest, PromptScoringResumesOnATargetThatLostTheSequence) {
  std::vector<int32_t> prompt = {1};
  for (int j = 0; j < 99; ++j) prompt.push_back(5 + (j * 31) % 280);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto target = MakeWorker(dir_->path(), 0);
  auto draft = MakeWorker(dir_->path(), 1);
  SpeculativeSequence s = Seq(400, prompt, greedy, 4, {});
  s.prompt_logprobs = {LogprobsMode::kRaw, 0};
  std::vector<SpeculativeSequence*> batch = {&s};
  std::vector<RoundStats> stats =
      RunSpeculationRound(*draft, *target, batch, RoundOptions{1 << 20});
  ASSERT_TRUE(stats[0].status.ok()) << stats[0].status;
  ASSERT_EQ(s.scored_len, 65);
  ASSERT_TRUE(target->Release(s.id).ok());
  s.ResetTargetCache(0);
  std::optional<std::vector<TokenLogprobs>> reported;
  for (int round = 0; round < 8 && !reported.has_value(); ++round) {
    stats = RunSpeculationRound(*draft, *target, batch, RoundOptions{1 << 20});
    ASSERT_TRUE(stats[0].status.ok()) << stats[0].status;
    reported = stats[0].prompt_logprobs;
  }
  ASSERT_TRUE(reported.has_value());
  ASSERT_EQ(reported->size(), prompt.size() - 1);
  const Reference ref =
      RunReference({prompt[0]}, std::vector<int32_t>(prompt.begin() + 1, prompt.end()), greedy);
  for (size_t j = 0; j < reported->size(); ++j) {
    EXPECT_NEAR((*reported)[j].logprob, ref.raw[j][static_cast<size_t>(prompt[j + 1])], kTolerance)
        << "token " << j;
  }
  EXPECT_TRUE(target->Release(s.id).ok());
  (void)draft->Release(s.id);
}

struct Case {
  std::string name;
  LogprobsMode mode;
  float temperature;
  int32_t top_k;
  int32_t num_candidates;  // M; 0 sends every rejection to the ReadRows fallback
  // Issue 17: a draft tree's logprobs come from the rows of its accepted path; prompt lookup's
  // from its chain's.
  TreeShape tree = {};
  DraftMethod method = DraftMethod::kModel;
};

class LogprobsReferenceTest : public LogprobsTest, public ::testing::WithParamInterface<Case> {};

TEST_P(LogprobsReferenceTest, EveryLogprobMatchesTheNumpyReferenceOfTheTarget) {
  const Case& c = GetParam();
  SamplingParams p;
  p.temperature = c.temperature;
  p.top_k = c.top_k;
  p.frequency_penalty = 0.4f;
  constexpr int32_t kTop = 5;
  constexpr size_t kNew = 20;
  auto target = MakeWorker(dir_->path(), 0);
  auto draft = MakeWorker(dir_->path(), 1);
  std::vector<SpeculativeSequence> seqs;
  for (int i = 0; i < 4; ++i) {
    SpeculativeSequence s = Seq(100 + i, Prompt(i), p, /*K=*/4, {c.mode, kTop}, 1000 + i);
    s.num_candidates = c.num_candidates;
    s.tree = c.tree;
    s.draft_method = c.method;
    s.ngram = {1, 2};
    seqs.push_back(std::move(s));
  }
  const std::vector<Generated> runs = Generate(*draft, *target, seqs, kNew);
  int read_rows = 0;
  for (const Generated& r : runs) read_rows += r.read_rows;
  if (c.num_candidates == 0 && c.temperature > 0.0f) {
    EXPECT_GT(read_rows, 0) << "the fallback was never taken: its logprobs are untested";
  }
  std::printf("[%s] %d corrections came from the ReadRows fallback\n", c.name.c_str(), read_rows);
  const bool processed = c.mode == LogprobsMode::kProcessed;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Generated& r = runs[i];
    ASSERT_EQ(r.logprobs.size(), kNew);
    const Reference ref = RunReference(Prompt(static_cast<int>(i)), r.tokens, p);
    ASSERT_EQ(ref.raw.size(), kNew);
    for (size_t j = 0; j < kNew; ++j) {
      const std::vector<double>& want = processed ? ref.processed[j] : ref.raw[j];
      const TokenLogprobs& lp = r.logprobs[j];
      const int32_t t = r.tokens[j];
      const std::string where = absl::StrCat("sequence ", i, " token ", j, " (id ", t, ")");
      ASSERT_TRUE(std::isfinite(want[static_cast<size_t>(t)]))
          << where << ": emitted outside the support";
      EXPECT_NEAR(lp.logprob, want[static_cast<size_t>(t)], kTolerance) << where;
      // The top-N: sorted, each value its token's, and the N largest of the row.
      ASSERT_EQ(lp.top_ids.size(), static_cast<size_t>(kTop)) << where;
      std::vector<double> sorted = want;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      for (size_t k = 0; k < lp.top_ids.size(); ++k) {
        const double expected = want[static_cast<size_t>(lp.top_ids[k])];
        if (k > 0) {
          EXPECT_GE(lp.top_logprobs[k - 1], lp.top_logprobs[k]) << where << " rank " << k;
        }
        if (std::isinf(expected)) {
          // Outside the processed support (top_k): -inf on both sides.
          EXPECT_TRUE(std::isinf(lp.top_logprobs[k]) && lp.top_logprobs[k] < 0) << where;
          continue;
        }
        EXPECT_NEAR(lp.top_logprobs[k], expected, kTolerance) << where << " rank " << k;
        EXPECT_NEAR(expected, sorted[k], kTolerance) << where << " rank " << k;
      }
      // The emitted token, when among the top, carries the same value there.
      for (size_t k = 0; k < lp.top_ids.size(); ++k) {
        if (lp.top_ids[k] == t) {
          EXPECT_TRUE(SameBits(lp.top_logprobs[k], lp.logprob)) << where;
        }
      }
      // A greedy token is the argmax: the first of the top.
      if (c.temperature == 0.0f) {
        EXPECT_EQ(lp.top_ids[0], t) << where;
      }
    }
    if (processed && c.top_k > 0 && c.top_k < kTop) {
      // Ranks past top_k are outside the support: -inf, which the HTTP API writes as -9999.
      for (const TokenLogprobs& lp : r.logprobs) {
        EXPECT_TRUE(std::isinf(lp.top_logprobs.back()));
      }
    }
  }
  EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LogprobsReferenceTest,
    ::testing::Values(
        Case{"raw_greedy", LogprobsMode::kRaw, 0.0f, 0, 4},
        Case{"raw_sampled", LogprobsMode::kRaw, 1.0f, 0, 4},
        Case{"raw_sampled_fallback", LogprobsMode::kRaw, 1.0f, 0, 0},
        Case{"processed_sampled_top_k3", LogprobsMode::kProcessed, 0.8f, 3, 4},
        Case{"processed_fallback", LogprobsMode::kProcessed, 1.0f, 0, 0},
        Case{"raw_greedy_tree_2x2", LogprobsMode::kRaw, 0.0f, 0, 4, {2, 2}},
        Case{"raw_sampled_tree_2x2", LogprobsMode::kRaw, 1.0f, 0, 4, {2, 2}},
        Case{"raw_tree_fallback", LogprobsMode::kRaw, 1.0f, 0, 0, {3, 1}},
        Case{"processed_tree_fallback", LogprobsMode::kProcessed, 1.0f, 0, 0, {2, 1}},
        Case{"raw_sampled_ngram", LogprobsMode::kRaw, 1.0f, 0, 0, {}, DraftMethod::kNgram}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// n completions: one seed, sample numbers 0..n-1.
class CompletionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.vocab_size = kVocab;
    spec.config.num_layers = 3;
    spec.config.max_position_embeddings = 32;
    spec.residual_scale = 0.8;
    spec.embed_std = 1.0;
    spec.seed = 5;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  // The first token of `seeds` requests, for sample numbers 0 and `second_sample`.
  static void FirstTokens(uint32_t second_sample, int seeds, std::vector<int32_t>* first,
                          std::vector<int32_t>* second) {
    auto target = MakeWorker(dir_->path(), 0);
    auto draft = MakeWorker(dir_->path(), 1);
    SamplingParams p;  // temperature 1
    for (int pass = 0; pass < 2; ++pass) {
      const uint32_t sample = pass == 0 ? 0 : second_sample;
      std::vector<int32_t>& out = pass == 0 ? *first : *second;
      for (int base = 0; base < seeds; base += 500) {
        std::vector<SpeculativeSequence> seqs;
        for (int i = base; i < std::min(seeds, base + 500); ++i) {
          SpeculativeSequence s;
          s.id = static_cast<uint64_t>(i + 1);
          s.tokens = kPrompt;
          s.prompt_len = static_cast<int64_t>(kPrompt.size());
          s.sampling = p;
          s.seed = 0xabc000ULL + static_cast<uint64_t>(i);
          s.sample = sample;
          s.num_speculative_tokens = 2;
          s.num_candidates = 2;
          seqs.push_back(std::move(s));
        }
        const std::vector<Generated> runs = Generate(*draft, *target, seqs, 1);
        for (const Generated& r : runs) out.push_back(r.tokens.at(0));
      }
    }
  }

  static std::vector<double> FirstTokenDistribution() {
    const std::filesystem::path in = dir_->path() / "first.json";
    const std::filesystem::path out = dir_->path() / "first_ref.json";
    {
      std::ofstream f(in);
      f << nlohmann::json(
               {{"prompt", kPrompt}, {"output", {0}}, {"params", nlohmann::json::object()}})
               .dump();
    }
    const std::string cmd = absl::StrCat(
        testing::Python(), " ",
        (testing::SourceDir() / "tests/services/coordinator/logprobs_reference.py").string(), " ",
        dir_->path().string(), " ", in.string(), " ", out.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);
    const nlohmann::json j = nlohmann::json::parse(f);
    std::vector<double> probs;
    for (const auto& x : j["processed"][0])
      probs.push_back(x.is_null() ? 0.0 : std::exp(x.get<double>()));
    return probs;
  }

  static constexpr int kVocab = 16;
  static inline ScopedTempDir* dir_ = nullptr;
  static inline const std::vector<int32_t> kPrompt = {1, 7, 3};
};

TEST_F(CompletionsTest, SampleNumbersReproduceAndDiffer) {
  auto target = MakeWorker(dir_->path(), 0);
  auto draft = MakeWorker(dir_->path(), 1);
  SamplingParams p;
  auto run = [&](uint32_t sample) {
    std::vector<SpeculativeSequence> seqs;
    SpeculativeSequence s;
    s.id = 1;
    s.tokens = kPrompt;
    s.prompt_len = 3;
    s.sampling = p;
    s.seed = 42;
    s.sample = sample;
    s.num_speculative_tokens = 3;
    seqs.push_back(s);
    return Generate(*draft, *target, seqs, 20).at(0).tokens;
  };
  std::vector<std::vector<int32_t>> outs;
  for (uint32_t sample = 0; sample < 4; ++sample) outs.push_back(run(sample));
  for (uint32_t sample = 0; sample < 4; ++sample) EXPECT_EQ(run(sample), outs[sample]);
  for (size_t a = 0; a < outs.size(); ++a) {
    for (size_t b = a + 1; b < outs.size(); ++b) EXPECT_NE(outs[a], outs[b]) << a << " vs " << b;
  }
}

// Independence of two completions' first tokens: they agree with probability sum_i p_i^2 when
// independent. The z statistic of the agreements against that, |z| < 4.5 (two-sided p ~ 7e-6),
// plus the chi-square of the second completion's first token against p (p-value > 1e-4).
// Power: a second completion that reuses sample number 0 agrees every time.
TEST_F(CompletionsTest, CompletionsAreIndependentDrawsFromTheTarget) {
  constexpr int kSeeds = 4000;
  const std::vector<double> p = FirstTokenDistribution();
  ASSERT_EQ(p.size(), static_cast<size_t>(kVocab));
  double q = 0.0;
  for (const double x : p) q += x * x;
  auto z_of = [&](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    int64_t agree = 0;
    for (size_t i = 0; i < a.size(); ++i) agree += a[i] == b[i];
    const double n = static_cast<double>(a.size());
    return (static_cast<double>(agree) - n * q) / std::sqrt(n * q * (1.0 - q));
  };
  std::vector<int32_t> first, second;
  FirstTokens(/*second_sample=*/1, kSeeds, &first, &second);
  const double z = z_of(first, second);
  std::vector<int64_t> counts(kVocab, 0);
  for (const int32_t t : second) ++counts[static_cast<size_t>(t)];
  std::vector<double> expected;
  for (const double x : p) expected.push_back(x * kSeeds);
  const double pv = testing::PearsonChiSquare(counts, expected).p_value;
  std::printf(
      "samples 0 and 1: agreement z = %.2f (expected rate %.4f); sample 1 chi-square "
      "p-value %.4f\n",
      z, q, pv);
  EXPECT_LT(std::abs(z), 4.5);
  EXPECT_GT(pv, kAlpha);

  std::vector<int32_t> again, same;
  FirstTokens(/*second_sample=*/0, 500, &again, &same);
  const double z_broken = z_of(again, same);
  std::printf("sample number ignored: agreement z = %.1f\n", z_broken);
  EXPECT_GT(z_broken, 4.5);
}

}  // namespace
}  // namespace specd
