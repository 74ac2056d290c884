// Speculation rounds over in-process workers: greedy speculative output equals plain decoding
// token for token for every K, on synthetic pairs of different agreement; sampled rounds keep the
// workers' caches consistent and return every KV block.
#include "services/coordinator/speculation_round.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/decode_loop.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/services/coordinator/forwarding_worker.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

std::unique_ptr<LocalWorker> MakeWorker(const std::filesystem::path& dir, int64_t exit_layer) {
  auto engine = testing::MakeEngine(dir, 1, /*kv_tokens=*/4096, exit_layer);
  if (engine == nullptr) return nullptr;
  return std::make_unique<LocalWorker>(
      std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
}

// A target and its one-layer early-exit draft on the small synthetic config.
struct SmallPair {
  SmallPair() {
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    testing::WriteSynth(spec, dir.path());
    target = MakeWorker(dir.path(), 0);
    draft = MakeWorker(dir.path(), 1);
  }
  void Release(const std::vector<SpeculativeSequence>& seqs) {
    for (const SpeculativeSequence& s : seqs) {
      EXPECT_TRUE(target->Release(s.id).ok());
      EXPECT_TRUE(draft->Release(s.id).ok());
    }
  }
  ScopedTempDir dir;
  std::unique_ptr<LocalWorker> target, draft;
};

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
    // Chunks of 5 tokens: longer prompts prefill over several rounds.
    const std::vector<RoundStats> stats =
        RunSpeculationRound(draft, target, running, RoundOptions{max_seq_len, nullptr, 5});
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

// Every way of drafting (issue 17) against plain decoding, token for token: prompt lookup, EGAG,
// and trees of several shapes, on prompts that repeat themselves so that prompt lookup matches.
struct MethodCase {
  const char* name;
  DraftMethod method;
  TreeShape tree;
  bool egag;
  int32_t k;
};
void PrintTo(const MethodCase& c, std::ostream* os) { *os << c.name; }

class MethodParityTest : public ::testing::TestWithParam<MethodCase> {};

TEST_P(MethodParityTest, GreedyOutputEqualsPlainAndEveryBlockReturns) {
  const MethodCase& c = GetParam();
  ScopedTempDir dir;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  spec.config.num_layers = 4;
  spec.config.max_position_embeddings = 128;
  spec.residual_scale = 0.3;
  spec.seed = 21;
  testing::WriteSynth(spec, dir.path());
  auto plain_engine = testing::MakeEngine(dir.path(), 1);
  ASSERT_NE(plain_engine, nullptr);
  constexpr int kPrompts = 12;
  constexpr int64_t kNew = 24;
  auto target = MakeWorker(dir.path(), 0);
  auto draft = MakeWorker(dir.path(), 1);
  std::vector<SpeculativeSequence> seqs(kPrompts);
  std::vector<std::vector<int32_t>> expected;
  for (int p = 0; p < kPrompts; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int rep = 0; rep < 3; ++rep) {
      for (int j = 0; j < 2 + p % 4; ++j) prompt.push_back(3 + (p * 31 + j * 17) % 290);
    }
    DecodeRequest req;
    req.prompt = prompt;
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = kNew;
    absl::StatusOr<DecodeResult> out = DecodePlain(*plain_engine, 1, req);
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), out->tokens.begin(), out->tokens.end());
    expected.push_back(full);
    SpeculativeSequence& s = seqs[static_cast<size_t>(p)];
    s.id = 500 + static_cast<SeqId>(p);
    s.tokens = prompt;
    s.prompt_len = static_cast<int64_t>(prompt.size());
    s.sampling.temperature = 0.0f;
    s.num_speculative_tokens = c.k;
    s.draft_method = c.method;
    s.ngram = {1, 3};
    s.tree = c.tree;
    s.egag.enabled = c.egag;
    s.egag.options = {0.5, 0.3, 1};
  }
  // Round by round, so that the KV of every tree round can be checked.
  int64_t drafted = 0, accepted = 0, rejections = 0, stops = 0, later = 0;
  std::vector<size_t> end;
  for (const SpeculativeSequence& s : seqs) end.push_back(s.tokens.size() + kNew);
  while (true) {
    std::vector<SpeculativeSequence*> running;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].tokens.size() < end[i]) running.push_back(&seqs[i]);
    }
    if (running.empty()) break;
    for (const RoundStats& st : RunSpeculationRound(*draft, *target, running, RoundOptions{128})) {
      ASSERT_TRUE(st.status.ok()) << st.status;
      drafted += st.drafted > 0;
      accepted += st.accepted;
      rejections += st.accepted < st.drafted;
      stops += st.entropy_stopped;
      later += st.later_children_accepted;
    }
    // Only the accepted path's KV remains: once the pending compaction has been applied by the
    // next call, the target holds exactly x but its last token (which every catch-up re-feeds).
    for (const SpeculativeSequence* s : running) {
      const absl::StatusOr<int64_t> held = target->runtime().CachedLength(s->id);
      ASSERT_TRUE(held.ok());
      if (s->target_compact.empty() && !s->target_tail) {
        EXPECT_EQ(*held, s->target_cached);
      }
      EXPECT_LE(s->target_cached, static_cast<int64_t>(s->tokens.size()));
    }
  }
  for (size_t p = 0; p < seqs.size(); ++p) {
    seqs[p].tokens.resize(std::min(seqs[p].tokens.size(), end[p]));
    EXPECT_EQ(seqs[p].tokens, expected[p]) << c.name << ", prompt " << p;
  }
  std::printf(
      "[%s] %lld drafting rounds, %lld accepted, %lld rejections, %lld EGAG stops, %lld "
      "later children accepted\n",
      c.name, static_cast<long long>(drafted), static_cast<long long>(accepted),
      static_cast<long long>(rejections), static_cast<long long>(stops),
      static_cast<long long>(later));
  EXPECT_GT(drafted, 20) << "the method hardly drafted: the test would be vacuous";
  EXPECT_GT(accepted, 10);
  EXPECT_GT(rejections, 5);
  if (c.egag) {
    EXPECT_GT(stops, 0);
  }
  if (c.tree.is_tree()) {
    EXPECT_GT(later, 0) << "no second-ranked child was ever accepted";
  }
  for (const SpeculativeSequence& s : seqs) {
    ASSERT_TRUE(target->Release(s.id).ok());
    if (s.uses_draft_worker()) {
      ASSERT_TRUE(draft->Release(s.id).ok());
    }
  }
  EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
  EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0);
  if (c.method == DraftMethod::kNgram) {
    EXPECT_EQ(draft->runtime().num_sequences(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Methods, MethodParityTest,
    ::testing::Values(MethodCase{"ngram_k4", DraftMethod::kNgram, {}, false, 4},
                      MethodCase{"egag_k6", DraftMethod::kModel, {}, true, 6},
                      MethodCase{"tree_b2_d1_k3", DraftMethod::kModel, {2, 1}, false, 3},
                      MethodCase{"tree_b2_d2_k4", DraftMethod::kModel, {2, 2}, false, 4},
                      MethodCase{"tree_b3_d2_k3", DraftMethod::kModel, {3, 2}, false, 3},
                      MethodCase{"tree_b4_d1_k5", DraftMethod::kModel, {4, 1}, false, 5}),
    [](const auto& info) { return std::string(info.param.name); });

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
  SmallPair pair;
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
        RunSpeculationRound(*pair.draft, *pair.target, batch, RoundOptions{256, &t});
    for (const RoundStats& st : stats) ASSERT_TRUE(st.status.ok()) << st.status;
    // One batched forward pass per draft position; in the first token's round the draft only
    // reads the prompts, in one pass, and the target judges no drafts.
    EXPECT_EQ(t.draft_steps, round == 0 ? 1 : 3);
    EXPECT_EQ(t.verify_tokens, target_cached[0] + target_cached[1] + (round == 0 ? 0 : 2 * 3));
    EXPECT_GT(t.draft_forward, absl::ZeroDuration());
    EXPECT_GT(t.verify_forward, absl::ZeroDuration());
    EXPECT_LE(t.draft_forward, t.draft);
    EXPECT_LE(t.verify_forward, t.verify);
    EXPECT_GE(t.round, t.draft + t.verify + t.accept + t.truncate);
  }
  pair.Release(seqs);
}

// Two prompts of 30 tokens under a pass budget of 12: the first prefills 12 a round until it
// has its first round, and only then does the second start; taking turns would delay both.
TEST(SpeculationRoundTest, PromptsOverThePassBudgetPrefillFirstComeFirstServed) {
  SmallPair pair;
  std::vector<SpeculativeSequence> seqs(2);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].id = i + 1;
    seqs[i].tokens = {1};
    for (int j = 0; j < 29; ++j) seqs[i].tokens.push_back(3 + (j * 7 + static_cast<int>(i)) % 200);
    seqs[i].prompt_len = 30;
    seqs[i].num_speculative_tokens = 3;
    seqs[i].sampling.temperature = 0.0f;
  }
  std::vector<SpeculativeSequence*> batch = {&seqs[0], &seqs[1]};
  const RoundOptions options{256, nullptr, /*prefill_chunk=*/0, /*draft_pass_tokens=*/12,
                             /*target_pass_tokens=*/12};
  for (int round = 0; round < 2; ++round) {
    const std::vector<RoundStats> stats =
        RunSpeculationRound(*pair.draft, *pair.target, batch, options);
    for (const RoundStats& st : stats) ASSERT_TRUE(st.status.ok()) << st.status;
    EXPECT_TRUE(stats[0].prefilling) << "round " << round;
    EXPECT_TRUE(stats[1].deferred) << "round " << round;
  }
  EXPECT_EQ(seqs[0].target_cached, 24);
  EXPECT_EQ(seqs[1].target_cached, 0);
  // 6 left for the first, whose whole round (6 + 3 drafts) fits; the second prefills the rest.
  const std::vector<RoundStats> third =
      RunSpeculationRound(*pair.draft, *pair.target, batch, options);
  EXPECT_FALSE(third[0].prefilling);
  EXPECT_FALSE(third[0].deferred);
  EXPECT_TRUE(third[1].prefilling);
  pair.Release(seqs);
}

// Workers whose replies about one sequence are damaged, as a worker of another build or a broken
// one might send them: the target's Verify results in rounds with drafts, or the draft's steps.
class MangledVerifyTarget final : public testing::ForwardingWorker {
 public:
  MangledVerifyTarget(WorkerApi& inner, SeqId victim,
                      std::function<void(VerifySequenceResult&)> mangle)
      : ForwardingWorker(inner), victim_(victim), mangle_(std::move(mangle)) {}
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    absl::StatusOr<std::vector<VerifySequenceResult>> results = inner_.Verify(batch);
    if (results.ok()) {
      for (VerifySequenceResult& v : *results) {
        if (v.seq == victim_ && v.status.ok() && !v.p_draft.empty()) mangle_(v);
      }
    }
    return results;
  }

 private:
  const SeqId victim_;
  const std::function<void(VerifySequenceResult&)> mangle_;
};

class MangledDraftWorker final : public testing::ForwardingWorker {
 public:
  using Mangle = std::function<void(SeqId, int32_t step, std::vector<DraftToken>&)>;
  MangledDraftWorker(WorkerApi& inner, SeqId victim, Mangle mangle)
      : ForwardingWorker(inner), victim_(victim), mangle_(std::move(mangle)) {}
  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    return inner_.Draft(batch, [&](const DraftStep& step) {
      std::vector<DraftToken> tokens(step.tokens.begin(), step.tokens.end());
      mangle_(victim_, step.step, tokens);
      DraftStep damaged = step;
      damaged.tokens = tokens;
      on_step(damaged);
    });
  }

 private:
  const SeqId victim_;
  const Mangle mangle_;
};

// The victim's token at `step` of a Draft call: dropped, or sent twice.
MangledDraftWorker::Mangle DamageDraftToken(int32_t at_step, bool twice) {
  return [at_step, twice](SeqId victim, int32_t step, std::vector<DraftToken>& tokens) {
    if (step != at_step) return;
    const auto it = std::find_if(tokens.begin(), tokens.end(),
                                 [&](const DraftToken& t) { return t.seq == victim; });
    if (it == tokens.end()) return;
    if (twice) {
      tokens.insert(it, *it);
    } else {
      tokens.erase(it);
    }
  };
}

struct MangleCase {
  std::string name;
  bool sampled = false;
  TreeShape tree;
  std::function<void(VerifySequenceResult&)> verify;  // the target's damage, or
  MangledDraftWorker::Mangle draft;                   // the draft's
  std::string message;                                // in the victim's error
};

void PrintTo(const MangleCase& c, std::ostream* os) { *os << c.name; }

class MalformedReplyTest : public ::testing::TestWithParam<MangleCase> {};

// A malformed reply fails its own sequence with INTERNAL and a message naming the worker; the
// coordinator reads nothing out of bounds, the other sequence of the batch generates exactly what
// it generates alone, and every KV block comes back.
TEST_P(MalformedReplyTest, FailsOnlyItsSequence) {
  const MangleCase& c = GetParam();
  SmallPair pair;
  const auto make = [&](SeqId id) {
    SpeculativeSequence s;
    s.id = id;
    s.tokens = {1, 7, 9, static_cast<int32_t>(20 + id)};
    s.prompt_len = 4;
    s.num_speculative_tokens = 3;
    s.tree = c.tree;
    s.seed = 99 + id;
    s.sampling.temperature = c.sampled ? 1.0f : 0.0f;
    return s;
  };
  std::vector<SpeculativeSequence> alone = {make(2)};
  Generate(*pair.draft, *pair.target, alone, 12, 256);
  pair.Release(alone);

  const SeqId victim = 1;
  MangledVerifyTarget target(
      *pair.target, victim, c.verify ? c.verify : [](VerifySequenceResult&) {});
  MangledDraftWorker draft(
      *pair.draft, victim, c.draft ? c.draft : [](SeqId, int32_t, std::vector<DraftToken>&) {});
  std::vector<SpeculativeSequence> seqs = {make(victim), make(2)};
  absl::Status victim_status;
  while (seqs[1].tokens.size() < alone[0].tokens.size()) {
    std::vector<SpeculativeSequence*> running = {&seqs[1]};
    if (victim_status.ok()) running.insert(running.begin(), &seqs[0]);
    const std::vector<RoundStats> stats =
        RunSpeculationRound(draft, target, running, RoundOptions{256});
    ASSERT_TRUE(stats.back().status.ok()) << stats.back().status;
    if (running.size() == 2 && !stats[0].status.ok()) victim_status = stats[0].status;
  }
  seqs[1].tokens.resize(alone[0].tokens.size());
  EXPECT_EQ(seqs[1].tokens, alone[0].tokens);
  EXPECT_EQ(victim_status.code(), absl::StatusCode::kInternal) << victim_status;
  EXPECT_THAT(std::string(victim_status.message()),
              ::testing::HasSubstr(c.verify ? "target worker" : "draft worker"));
  EXPECT_THAT(std::string(victim_status.message()), ::testing::HasSubstr(c.message));
  pair.Release(seqs);
  EXPECT_EQ(pair.target->runtime().engine().kv().used_blocks(), 0);
  EXPECT_EQ(pair.draft->runtime().engine().kv().used_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Replies, MalformedReplyTest,
    ::testing::Values(
        MangleCase{"argmax_short",
                   false,
                   {},
                   [](VerifySequenceResult& v) { v.argmax.pop_back(); },
                   nullptr,
                   "argmax rows"},
        MangleCase{"p_draft_long",
                   false,
                   {},
                   [](VerifySequenceResult& v) { v.p_draft.push_back(0.5f); },
                   nullptr,
                   "draft probabilities"},
        MangleCase{"position_off",
                   false,
                   {},
                   [](VerifySequenceResult& v) { v.position += 1; },
                   nullptr,
                   "at position"},
        MangleCase{"candidate_rows_short",
                   true,
                   {},
                   [](VerifySequenceResult& v) { v.candidate_tokens.pop_back(); },
                   nullptr,
                   "candidate rows"},
        MangleCase{"candidate_probs_short",
                   true,
                   {},
                   [](VerifySequenceResult& v) { v.candidate_probs.back().pop_back(); },
                   nullptr,
                   "candidate probabilities in a row"},
        MangleCase{"tree_leaf_bonus_short",
                   true,
                   {2, 1},
                   [](VerifySequenceResult& v) { v.leaf_bonus.pop_back(); },
                   nullptr,
                   "leaf bonus tokens"},
        MangleCase{"tree_argmax_long",
                   false,
                   {2, 2},
                   [](VerifySequenceResult& v) { v.argmax.push_back(0); },
                   nullptr,
                   "argmax rows"},
        MangleCase{
            "draft_token_dropped", true, {}, nullptr, DamageDraftToken(2, false), "2 of 3 tokens"},
        MangleCase{
            "draft_token_twice", false, {}, nullptr, DamageDraftToken(1, true), "4 of 3 tokens"},
        MangleCase{
            "tree_node_dropped", false, {2, 1}, nullptr, DamageDraftToken(1, false), "tree nodes"}),
    [](const ::testing::TestParamInfo<MangleCase>& info) { return info.param.name; });

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
