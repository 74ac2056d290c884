// Classifier-free guidance in the worker: the guided logits against an independent numpy
// reference (tests/reference/cfg_ref.py: llama_ref on both texts, combined), the kept rows of a
// guided Verify and Draft against the reference's processed distribution (penalties over the
// conditional text only), and the pair as one unit: fed in the same pass, admitted, truncated,
// dropped, chunked and released together, with bad companions refused and harming nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/llama_engine.h"
#include "common/sampling/row_pool.h"
#include "common/sampling/row_sampler.h"
#include "common/synth/synth.h"
#include "common/worker/worker_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/worker/worker_model_suite.h"
#include "tests/common/worker/worker_reference.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using testing::SameBits;
using testing::Trunc;
using testing::WorkerPrompt;
using Tokens = std::vector<int32_t>;

constexpr int64_t kVocab = testing::kWorkerTestVocab;
constexpr int64_t kBlock = 16;

// Temperature and every penalty: the penalties must read the conditional text only.
SamplingParams Penalized() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.3f;
  return p;
}

CompanionRequest Companion(SeqId seq, float scale, Tokens catch_up, int64_t cached = 0) {
  return CompanionRequest{seq, scale, std::move(catch_up), cached};
}

VerifySequenceRequest VerifyReq(SeqId seq, Tokens catch_up, int64_t cached, Tokens drafts,
                                int64_t prompt_len, std::optional<CompanionRequest> companion,
                                const SamplingParams& p = Penalized()) {
  VerifySequenceRequest r;
  r.seq = seq;
  r.catch_up = std::move(catch_up);
  r.expected_cached_len = cached;
  r.drafts = std::move(drafts);
  r.sampling = p;
  r.seed = 11 + seq;
  r.prompt_len = prompt_len;
  r.companion = std::move(companion);
  return r;
}

// Records forward passes and the companion-block gauge.
class Observer final : public RuntimeObserver {
 public:
  void OnForward(ForwardKind kind, int64_t batch_size, int64_t, absl::Duration) override {
    passes.push_back({kind, batch_size});
  }
  void OnKvChanged(const KvPool&) override {}
  void OnPrefixCache(int64_t, int64_t) override {}
  void OnCompanionKv(int64_t blocks) override { companion_blocks = blocks; }
  std::vector<std::pair<ForwardKind, int64_t>> passes;
  int64_t companion_blocks = -1;
};

class GuidanceTest : public testing::WorkerModelSuite<> {
 protected:
  static std::unique_ptr<LlamaEngine> Engine(int64_t kv_tokens = 4096, bool prefix_caching = true) {
    EngineOptions options;
    options.kv_block_size = kBlock;
    options.kv_capacity_tokens = kv_tokens;
    options.prefix_caching = prefix_caching;
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(model_dir(), 1, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }
  static std::unique_ptr<WorkerRuntime> Runtime(int64_t kv_tokens = 4096,
                                                RuntimeObserver* observer = nullptr,
                                                bool prefix_caching = true) {
    WorkerRuntimeOptions options;
    options.observer = observer;
    return std::make_unique<WorkerRuntime>(Engine(kv_tokens, prefix_caching), options);
  }

  // Runs a reference script with `args` and reads its float64 output.
  static std::vector<double> Reference(const std::string& script, const std::string& args,
                                       size_t count) {
    return testing::RunF64Reference(script, model_dir(), model_dir() / "reference.f64", args,
                                    count);
  }

  static std::string Ids(const Tokens& t) { return t.empty() ? "\"\"" : absl::StrJoin(t, ","); }
};

// The bound for fp32 guided logits against the float64 reference: per row,
// |a - b| <= 1e-4 * max|b| + 1e-5 (scales up to 10 amplify rounding, hence the absolute term).
TEST_F(GuidanceTest, GuidedLogitsMatchTheNumpyReference) {
  const Tokens cond = WorkerPrompt(23, 1);
  const Tokens uncond = WorkerPrompt(9, 2);
  const Tokens other = WorkerPrompt(12, 3);
  const Tokens gen = {5, 77, 123, 9};
  for (const float scale : {0.25f, 1.5f, 3.0f, 10.0f}) {
    SCOPED_TRACE(absl::StrCat("scale ", scale));
    auto engine = Engine();
    // One pass as the worker runs it: the guided sequence, an unguided one, then the companion.
    Tokens x = cond, u = uncond;
    x.insert(x.end(), gen.begin(), gen.end());
    u.insert(u.end(), gen.begin(), gen.end());
    const int32_t rows = static_cast<int32_t>(gen.size()) + 1;
    std::vector<SequenceInput> batch(3);
    const Tokens* texts[3] = {&x, &other, &u};
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(engine->AddSequence(static_cast<SeqId>(i + 1)).ok());
      batch[i].seq = static_cast<SeqId>(i + 1);
      batch[i].tokens = *texts[i];
      const int32_t n = static_cast<int32_t>(texts[i]->size());
      for (int32_t j = i == 1 ? n - 1 : n - rows; j < n; ++j) batch[i].logit_indices.push_back(j);
    }
    absl::StatusOr<Logits> logits = engine->Forward(batch);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->rows, 2 * rows + 1);
    RowPool pool(engine->backend(), kVocab);
    RowSampler sampler(engine->backend());
    for (int32_t j = 0; j < rows; ++j) sampler.AddGuidance(j, rows + 1 + j, scale);
    ASSERT_TRUE(sampler.Run(logits->data, logits->rows, pool).ok());
    absl::StatusOr<std::vector<float>> ours = engine->ReadLogits(*logits);
    ASSERT_TRUE(ours.ok()) << ours.status();

    const std::vector<double> ref =
        Reference("tests/reference/cfg_ref.py",
                  absl::StrCat(scale, " ", Ids(cond), " ", Ids(uncond), " ", Ids(gen)),
                  static_cast<size_t>(rows * kVocab));
    double worst = 0.0;
    for (int32_t j = 0; j < rows; ++j) {
      double max_abs = 0.0;
      for (int64_t v = 0; v < kVocab; ++v)
        max_abs = std::max(max_abs, std::fabs(ref[j * kVocab + v]));
      const double bound = 1e-4 * max_abs + 1e-5;
      for (int64_t v = 0; v < kVocab; ++v) {
        const double a = (*ours)[static_cast<size_t>(j * kVocab + v)];
        const double b = ref[static_cast<size_t>(j * kVocab + v)];
        worst = std::max(worst, std::fabs(a - b) / bound);
        ASSERT_LE(std::fabs(a - b), bound) << "row " << j << " token " << v;
      }
    }
    std::printf("[scale %g] worst |a - b| / bound = %.3f\n", scale, worst);
  }
}

// Every kept row of a batched guided Verify, and of a guided Draft, is the processed
// distribution of the reference's guided logits with penalties over the conditional text. Rows
// are probabilities from logits within the bound above, so they agree to a relative 1e-2 (a logit
// error of 1e-3 moves a probability by about 1e-3 / temperature relative) plus 1e-6 absolute.
TEST_F(GuidanceTest, KeptRowsAreTheProcessedGuidedDistribution) {
  auto rt = Runtime();
  const Tokens cond = WorkerPrompt(21, 4);
  const Tokens uncond_a = WorkerPrompt(6, 5);
  const Tokens drafts = {cond[3], 17, cond[3]};  // repeats, so the penalties bite
  std::vector<VerifySequenceRequest> batch = {
      VerifyReq(1, cond, 0, drafts, 21, Companion(1001, 3.0f, uncond_a)),
      VerifyReq(2, WorkerPrompt(15, 6), 0, {8, 9}, 15, std::nullopt),
      VerifyReq(3, cond, 0, drafts, 21, Companion(1003, 0.5f, {1})),
  };
  std::vector<VerifySequenceResult> results = rt->Verify(batch);
  for (const VerifySequenceResult& r : results) ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(results[0].companion_cached_len, 6 + 3);
  EXPECT_EQ(results[1].companion_cached_len, 0);
  EXPECT_EQ(results[2].companion_cached_len, 1 + 3);

  const auto expect_rows = [&](SeqId seq, float scale, const Tokens& uncond, const Tokens& gen) {
    SCOPED_TRACE(absl::StrCat("sequence ", seq));
    const SamplingParams p = Penalized();
    const size_t rows = gen.size() + 1;
    const std::vector<double> ref = Reference(
        "tests/common/worker/guided_rows_reference.py",
        absl::StrCat(scale, " ", p.temperature, " ", p.repetition_penalty, " ", p.presence_penalty,
                     " ", p.frequency_penalty, " ", Ids(cond), " ", Ids(uncond), " ", Ids(gen)),
        rows * kVocab);
    for (size_t j = 0; j < rows; ++j) {
      absl::StatusOr<ProbRow> kept = rt->ReadRow(seq, static_cast<int32_t>(j + 1));
      ASSERT_TRUE(kept.ok()) << kept.status();
      absl::StatusOr<std::vector<float>> row = DensifyRow(*kept, kVocab, "kept");
      ASSERT_TRUE(row.ok());
      for (int64_t v = 0; v < kVocab; ++v) {
        const double want = ref[j * kVocab + static_cast<size_t>(v)];
        ASSERT_NEAR((*row)[static_cast<size_t>(v)], want, 1e-2 * want + 1e-6)
            << "row " << j + 1 << " token " << v;
      }
    }
  };
  expect_rows(1, 3.0f, uncond_a, drafts);
  expect_rows(3, 0.5f, {1}, drafts);

  // A guided draft: its q rows follow the same definition, and its tokens are drawn from them.
  DraftSequenceRequest d;
  d.seq = 4;
  d.catch_up = cond;
  d.num_speculative_tokens = 3;
  d.sampling = Penalized();
  d.seed = 99;
  d.prompt_len = 21;
  d.companion = Companion(1004, 3.0f, uncond_a);
  Tokens drafted;
  const std::vector<SequenceOutcome> outcomes =
      rt->Draft(std::vector<DraftSequenceRequest>{d}, [&](const DraftStep& step) {
        for (const DraftToken& t : step.tokens) drafted.push_back(t.token);
      });
  ASSERT_TRUE(outcomes[0].status.ok()) << outcomes[0].status;
  ASSERT_EQ(drafted.size(), 3u);
  // The draft's rows are q_1..q_3, conditioned on the first two drafts.
  Tokens gen(drafted.begin(), drafted.end() - 1);
  const std::vector<double> ref =
      Reference("tests/common/worker/guided_rows_reference.py",
                absl::StrCat(3.0f, " ", d.sampling.temperature, " ", d.sampling.repetition_penalty,
                             " ", d.sampling.presence_penalty, " ", d.sampling.frequency_penalty,
                             " ", Ids(cond), " ", Ids(uncond_a), " ", Ids(gen)),
                3 * kVocab);
  for (size_t j = 0; j < 3; ++j) {
    absl::StatusOr<ProbRow> kept = rt->ReadRow(4, static_cast<int32_t>(j + 1));
    ASSERT_TRUE(kept.ok()) << kept.status();
    absl::StatusOr<std::vector<float>> row = DensifyRow(*kept, kVocab, "kept");
    ASSERT_TRUE(row.ok());
    EXPECT_GT((*row)[static_cast<size_t>(drafted[j])], 0.0f) << "draft " << j + 1;
    for (int64_t v = 0; v < kVocab; ++v) {
      const double want = ref[j * kVocab + static_cast<size_t>(v)];
      ASSERT_NEAR((*row)[static_cast<size_t>(v)], want, 1e-2 * want + 1e-6)
          << "draft row " << j + 1 << " token " << v;
    }
  }
  for (const SeqId seq : {1, 2, 3, 4}) EXPECT_TRUE(rt->Release(seq).ok());
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
}

// Logprobs, where asked, are those of the guided distribution: the raw ones are the log-softmax
// of the penalised guided logits of the reference, to 1e-4 (the worst error here is 2.5e-6; the
// logit bound above would allow twice 1e-4 max|b| + 1e-5, and unguided logprobs miss by O(1)).
TEST_F(GuidanceTest, LogprobsAreThoseOfTheGuidedDistribution) {
  auto rt = Runtime();
  const Tokens cond = WorkerPrompt(19, 9);
  const Tokens uncond = WorkerPrompt(7, 10);
  const Tokens drafts = {cond[2], 41};
  VerifySequenceRequest req = VerifyReq(1, cond, 0, drafts, 19, Companion(101, 2.5f, uncond));
  req.num_candidates = 2;
  req.logprobs = {LogprobsMode::kRaw, 5};
  const VerifySequenceResult r = rt->Verify(std::vector{req})[0];
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.logprobs.size(), drafts.size() + 1);
  const SamplingParams p = Penalized();
  const std::vector<double> ref =
      Reference("tests/common/worker/guided_rows_reference.py",
                absl::StrCat(2.5f, " ", p.temperature, " ", p.repetition_penalty, " ",
                             p.presence_penalty, " ", p.frequency_penalty, " ", Ids(cond), " ",
                             Ids(uncond), " ", Ids(drafts), " raw"),
                (drafts.size() + 1) * kVocab);
  double worst = 0.0;
  for (size_t j = 0; j <= drafts.size(); ++j) {
    const PositionLogprobs& lp = r.logprobs[j];
    const double* row = &ref[j * kVocab];
    std::vector<int32_t> order(kVocab);
    for (int32_t v = 0; v < kVocab; ++v) order[static_cast<size_t>(v)] = v;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    ASSERT_EQ(lp.top_ids.size(), 5u);
    for (size_t t = 0; t < 5; ++t) {
      EXPECT_EQ(lp.top_ids[t], order[t]) << "position " << j + 1 << ", rank " << t;
      worst = std::max(worst, std::fabs(lp.top_logprobs[t] - row[lp.top_ids[t]]));
      EXPECT_NEAR(lp.top_logprobs[t], row[lp.top_ids[t]], 1e-4) << "position " << j + 1;
    }
    for (size_t t = 0; t < lp.token_ids.size(); ++t) {
      worst = std::max(worst, std::fabs(lp.token_logprobs[t] - row[lp.token_ids[t]]));
      EXPECT_NEAR(lp.token_logprobs[t], row[lp.token_ids[t]], 1e-4) << "position " << j + 1;
    }
  }
  std::printf("worst |logprob - reference| = %.3g\n", worst);
}

// What a coordinator claiming the worker frees: plain sequences and guided pairs alike.
TEST_F(GuidanceTest, ReleaseAllFreesEverySequenceAndEveryCompanion) {
  Observer observer;
  auto rt = Runtime(4096, &observer, /*prefix_caching=*/false);
  EXPECT_EQ(rt->ReleaseAll(), 0);
  std::vector<VerifySequenceResult> r = rt->Verify(std::vector{
      VerifyReq(1, WorkerPrompt(20, 1), 0, {5, 6}, 20, Companion(101, 2.0f, WorkerPrompt(40, 2))),
      VerifyReq(2, WorkerPrompt(30, 3), 0, {7}, 30, std::nullopt)});
  for (const VerifySequenceResult& v : r) ASSERT_TRUE(v.status.ok()) << v.status;
  ASSERT_EQ(rt->num_sequences(), 3);
  ASSERT_GT(rt->engine().kv().used_blocks(), 0);

  EXPECT_EQ(rt->ReleaseAll(), 2);
  EXPECT_EQ(rt->num_sequences(), 0);
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
  for (const SeqId seq : {1, 2, 101}) {
    EXPECT_EQ(rt->CachedLength(seq).status().code(), absl::StatusCode::kNotFound) << seq;
  }
  // The ids are free again: a new coordinator starts its own from 1.
  r = rt->Verify(std::vector{VerifyReq(1, WorkerPrompt(20, 1), 0, {5}, 20, std::nullopt)});
  EXPECT_TRUE(r[0].status.ok()) << r[0].status;
}

TEST_F(GuidanceTest, ThePairIsFedInOnePassAndTruncatedDroppedAndReleasedAsOne) {
  Observer observer;
  auto rt = Runtime(4096, &observer, /*prefix_caching=*/false);
  const Tokens cond = WorkerPrompt(20, 1);
  const Tokens uncond = WorkerPrompt(40, 2);
  // 22 tokens (2 blocks) and 42 (3 blocks), in one verify pass of two sequences.
  std::vector<VerifySequenceResult> r =
      rt->Verify(std::vector{VerifyReq(1, cond, 0, {5, 6}, 20, Companion(101, 2.0f, uncond))});
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(r[0].cached_len, 22);
  EXPECT_EQ(r[0].companion_cached_len, 42);
  EXPECT_EQ(*rt->CachedLength(101), 42);
  ASSERT_EQ(observer.passes.size(), 1u);
  EXPECT_EQ(observer.passes[0], std::make_pair(ForwardKind::kVerify, int64_t{2}));
  EXPECT_EQ(rt->engine().kv().used_blocks(), 5);
  EXPECT_EQ(observer.companion_blocks, 3);

  // The companion is never named on its own, and a guided truncate names both lengths.
  const auto expect_invalid = [](const absl::Status& st, const std::string& says) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(says));
  };
  expect_invalid(rt->Truncate(Trunc(1, 21)).status(), "companion_new_len is required");
  expect_invalid(rt->Truncate(Trunc(101, 41)).status(), "is the companion of 1");
  expect_invalid(rt->Release(101), "releasing that sequence releases both");
  TruncateSequenceRequest negative = Trunc(1, 21);
  negative.companion_new_len = -1;
  expect_invalid(rt->Truncate(negative).status(), "companion_new_len must be >= 0");
  expect_invalid(rt->Verify(std::vector{VerifyReq(1, {9}, 22, {}, 20, std::nullopt)})[0].status,
                 "created with companion 101");
  expect_invalid(
      rt->Verify(std::vector{VerifyReq(1, {9}, 22, {}, 20, Companion(102, 2.0f, {9}, 42))})[0]
          .status,
      "created with companion 101");
  expect_invalid(rt->Verify(std::vector{VerifyReq(101, {9}, 42, {}, 20, std::nullopt)})[0].status,
                 "is the companion of 1");
  expect_invalid(
      rt->Verify(std::vector{VerifyReq(2, cond, 0, {}, 20, Companion(101, 2.0f, uncond))})[0]
          .status,
      "is another sequence of this worker");
  expect_invalid(
      rt->Verify(std::vector{VerifyReq(3, cond, 0, {}, 20, Companion(1, 2.0f, uncond))})[0].status,
      "is another sequence of this worker");
  expect_invalid(
      rt->Verify(std::vector{VerifyReq(4, cond, 0, {}, 20, Companion(104, NAN, uncond))})[0].status,
      "companion.scale must be finite");
  expect_invalid(
      rt->Verify(std::vector{VerifyReq(5, cond, 0, {}, 20, Companion(104, 2.0f, {kVocab}))})[0]
          .status,
      "companion catch-up index 0");
  // Both halves' lengths are checked: a wrong companion length fails and changes nothing.
  const absl::Status mismatch =
      rt->Verify(std::vector{VerifyReq(1, {9}, 22, {}, 20, Companion(101, 2.0f, {9}, 40))})[0]
          .status;
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition) << mismatch;
  for (const SeqId seq : {2, 3, 4, 5}) {
    EXPECT_EQ(rt->CachedLength(seq).status().code(), absl::StatusCode::kNotFound) << seq;
  }
  EXPECT_EQ(*rt->CachedLength(1), 22);
  EXPECT_EQ(*rt->CachedLength(101), 42);
  EXPECT_EQ(rt->engine().kv().used_blocks(), 5);

  // Draft 5 accepted, 6 rejected and corrected to 9: the next call drops both tails (drop_tail).
  VerifySequenceRequest next = VerifyReq(1, {9}, 21, {}, 20, Companion(101, 2.0f, {9}, 41));
  next.drop_tail = true;
  r = rt->Verify(std::vector{next});
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  EXPECT_EQ(r[0].cached_len, 22);
  EXPECT_EQ(r[0].companion_cached_len, 42);

  // Truncate cuts both, idempotently.
  TruncateSequenceRequest cut = Trunc(1, 17);
  cut.companion_new_len = 37;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<TruncateResult> t = rt->Truncate(cut);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->cached_len, 17);
    EXPECT_EQ(t->companion_cached_len, 37);
  }
  EXPECT_EQ(rt->engine().kv().used_blocks(), 2 + 3);
  EXPECT_EQ(observer.companion_blocks, 3);

  ASSERT_TRUE(rt->Release(1).ok());
  EXPECT_EQ(rt->CachedLength(101).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
  EXPECT_EQ(observer.companion_blocks, 0);
}

TEST_F(GuidanceTest, AdmissionCountsTheCompanionAndAFailedPairLeavesNothing) {
  // 4 blocks: the sequence alone (2) fits, with its 3-block companion it does not.
  auto rt = Runtime(4 * kBlock);
  const Tokens cond = WorkerPrompt(20, 1);
  const std::vector<VerifySequenceResult> r = rt->Verify(
      std::vector{VerifyReq(1, cond, 0, {5, 6}, 20, Companion(101, 2.0f, WorkerPrompt(40, 2)))});
  EXPECT_EQ(r[0].status.code(), absl::StatusCode::kResourceExhausted) << r[0].status;
  EXPECT_THAT(std::string(r[0].status.message()), HasSubstr("with its companion"));
  EXPECT_EQ(rt->CachedLength(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt->CachedLength(101).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
  EXPECT_TRUE(
      rt->Verify(std::vector{VerifyReq(1, cond, 0, {5, 6}, 20, std::nullopt)})[0].status.ok());
}

// A long unconditional prompt is chunked with its sequence: the pair reports prefilling until
// both halves have their whole catch-up, and then verifies to the same bits as unchunked.
TEST_F(GuidanceTest, ChunkedPrefillFeedsBothHalvesAndChangesNoBit) {
  const Tokens cond = WorkerPrompt(30, 7);
  const Tokens uncond = WorkerPrompt(75, 8);
  const Tokens drafts = {4, 40, 140};
  auto whole = Runtime();
  ASSERT_TRUE(
      whole->Verify(std::vector{VerifyReq(1, cond, 0, drafts, 30, Companion(101, 4.0f, uncond))})[0]
          .status.ok());
  auto chunked = Runtime();
  int64_t cached = 0, companion_cached = 0;
  int prefilling_calls = 0;
  while (true) {
    VerifySequenceRequest req =
        VerifyReq(1, Tokens(cond.begin() + cached, cond.end()), cached, drafts, 30,
                  Companion(101, 4.0f, Tokens(uncond.begin() + companion_cached, uncond.end()),
                            companion_cached));
    req.max_prefill_tokens = kBlock;
    const VerifySequenceResult r = chunked->Verify(std::vector{req})[0];
    ASSERT_TRUE(r.status.ok()) << r.status;
    cached = r.cached_len;
    companion_cached = r.companion_cached_len;
    if (!r.prefilling) break;
    ++prefilling_calls;
    ASSERT_LT(prefilling_calls, 10);
  }
  EXPECT_EQ(prefilling_calls, 4);  // 16 + 16 + 16 + 16 of the 75 companion tokens, then the rest
  EXPECT_EQ(cached, 33);
  EXPECT_EQ(companion_cached, 78);
  for (int32_t step = 1; step <= 4; ++step) {
    EXPECT_EQ(*chunked->ReadRow(1, step), *whole->ReadRow(1, step)) << "step " << step;
  }
}

// Draft trees and guidance do not meet (the coordinator refuses the request): a guided sequence
// drafting or verifying a tree, or compacting one, is INVALID_ARGUMENT and leaves nothing. A
// guided chain sharing its passes with a tree's many logit rows is combined with its own
// companion's rows: it drafts and verifies to the same bits as alone.
TEST_F(GuidanceTest, AGuidedSequenceDraftsAndVerifiesChainsOnlyAndSharesPassesWithTrees) {
  const auto expect_invalid = [](const absl::Status& st, const std::string& says) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(says));
  };
  const Tokens cond = WorkerPrompt(18, 3);
  const Tokens uncond = WorkerPrompt(7, 4);
  const auto draft_req = [&](SeqId seq, std::optional<CompanionRequest> companion) {
    DraftSequenceRequest d;
    d.seq = seq;
    d.catch_up = cond;
    d.num_speculative_tokens = 3;
    d.sampling = Penalized();
    d.seed = 77;
    d.prompt_len = 18;
    d.companion = std::move(companion);
    return d;
  };
  {
    auto rt = Runtime();
    DraftSequenceRequest tree = draft_req(1, Companion(101, 2.0f, uncond));
    tree.tree = {2, 1};
    expect_invalid(rt->Draft(std::vector{tree})[0].status, "cannot draft a tree");
    VerifySequenceRequest v = VerifyReq(2, cond, 0, {5, 6}, 18, Companion(102, 2.0f, uncond));
    v.tree_parents = {-1, -1};
    expect_invalid(rt->Verify(std::vector{v})[0].status, "cannot verify a tree");
    for (const SeqId seq : {1, 2, 101, 102}) {
      EXPECT_EQ(rt->CachedLength(seq).status().code(), absl::StatusCode::kNotFound) << seq;
    }
    // A guided pair that exists refuses a compaction and keeps both lengths.
    ASSERT_TRUE(
        rt->Verify(std::vector{VerifyReq(3, cond, 0, {5, 6}, 18, Companion(103, 2.0f, uncond))})[0]
            .status.ok());
    VerifySequenceRequest compact = VerifyReq(3, {9}, 19, {}, 18, Companion(103, 2.0f, {9}, 8));
    compact.compact = {18, {0}};
    expect_invalid(rt->Verify(std::vector{compact})[0].status, "has no tree to compact");
    EXPECT_EQ(*rt->CachedLength(3), 20);
    EXPECT_EQ(*rt->CachedLength(103), 9);
    EXPECT_TRUE(rt->Release(3).ok());
    EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
  }

  // Alone, then after an unguided tree in the same calls.
  std::vector<std::vector<DraftToken>> drafted(2);
  std::vector<VerifySequenceResult> verified(2);
  for (int run = 0; run < 2; ++run) {
    auto rt = Runtime();
    std::vector<DraftSequenceRequest> draft_batch;
    std::vector<VerifySequenceRequest> verify_batch;
    if (run == 1) {
      DraftSequenceRequest tree = draft_req(5, std::nullopt);
      tree.catch_up = WorkerPrompt(12, 6);
      tree.prompt_len = 12;
      tree.tree = {3, 2};
      draft_batch.push_back(tree);
      VerifySequenceRequest v =
          VerifyReq(6, WorkerPrompt(11, 7), 0, {4, 8, 12, 40, 41, 42}, 11, std::nullopt);
      v.tree_parents = {-1, -1, 0, 0, 1, 1};
      verify_batch.push_back(v);
    }
    draft_batch.push_back(draft_req(1, Companion(101, 2.5f, uncond)));
    verify_batch.push_back(VerifyReq(2, cond, 0, {cond[2], 17}, 18, Companion(102, 2.5f, uncond)));
    verify_batch.back().num_candidates = 2;
    const std::vector<SequenceOutcome> outcomes =
        rt->Draft(draft_batch, [&](const DraftStep& step) {
          for (const DraftToken& t : step.tokens) {
            if (t.seq == 1) drafted[static_cast<size_t>(run)].push_back(t);
          }
        });
    for (const SequenceOutcome& o : outcomes) ASSERT_TRUE(o.status.ok()) << o.status;
    std::vector<VerifySequenceResult> results = rt->Verify(verify_batch);
    for (const VerifySequenceResult& r : results) ASSERT_TRUE(r.status.ok()) << r.status;
    verified[static_cast<size_t>(run)] = results.back();
  }
  ASSERT_EQ(drafted[0].size(), 3u);
  ASSERT_EQ(drafted[1].size(), 3u);
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(drafted[1][j].token, drafted[0][j].token) << "draft " << j + 1;
    EXPECT_TRUE(SameBits(drafted[1][j].q_prob, drafted[0][j].q_prob)) << "draft " << j + 1;
  }
  EXPECT_EQ(verified[1].argmax, verified[0].argmax);
  EXPECT_TRUE(SameBits(verified[1].p_draft, verified[0].p_draft));
  EXPECT_EQ(verified[1].bonus_token, verified[0].bonus_token);
  EXPECT_EQ(verified[1].candidate_tokens, verified[0].candidate_tokens);
}

}  // namespace
}  // namespace specd
