// WorkerRuntime against an independent oracle (worker_reference.h): probabilities bit for bit,
// draft tokens from the DRAFT_SAMPLE stream, candidates and bonus tokens from theirs, plus the
// sequence table's bookkeeping: Truncate queries, ReadRow, chunked catch-up, per-sequence errors
// and KV accounting.
#include "common/worker/worker_runtime.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/engine/decode_loop.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/worker/worker_model_suite.h"
#include "tests/common/worker/worker_reference.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::EveryFilter;
using testing::ExpectedDraft;
using testing::ExpectedVerify;
using ::testing::HasSubstr;
using testing::RowOracle;
using testing::SameBits;
using testing::Trunc;
using testing::WorkerPrompt;

using Drafts = std::vector<DraftSequenceRequest>;
using Verifies = std::vector<VerifySequenceRequest>;

constexpr int64_t kVocab = testing::kWorkerTestVocab;
constexpr int64_t kBlock = 16;

SamplingParams Sampled(float temperature = 0.9f) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

SamplingParams Greedy() { return Sampled(0.0f); }

class WorkerRuntimeTest : public testing::WorkerModelSuite<> {
 protected:
  static std::unique_ptr<LlamaEngine> Engine(int64_t kv_tokens = 4096, int64_t max_seq_len = 0,
                                             bool prefix_caching = true) {
    EngineOptions options;
    options.kv_block_size = kBlock;
    options.kv_capacity_tokens = kv_tokens;
    options.max_seq_len = max_seq_len;
    options.prefix_caching = prefix_caching;
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(model_dir(), 1, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  static std::unique_ptr<WorkerRuntime> Runtime(int64_t kv_tokens = 4096, int64_t max_seq_len = 0,
                                                RuntimeObserver* observer = nullptr,
                                                bool prefix_caching = true) {
    WorkerRuntimeOptions options;
    options.observer = observer;
    return std::make_unique<WorkerRuntime>(Engine(kv_tokens, max_seq_len, prefix_caching), options);
  }

  RowOracle oracle_{Engine()};
};

DraftSequenceRequest DraftReq(SeqId seq, std::vector<int32_t> catch_up, int64_t cached, int32_t K,
                              const SamplingParams& p, uint64_t seed, int64_t prompt_len) {
  DraftSequenceRequest r;
  r.seq = seq;
  r.catch_up = std::move(catch_up);
  r.expected_cached_len = cached;
  r.num_speculative_tokens = K;
  r.sampling = p;
  r.seed = seed;
  r.prompt_len = prompt_len;
  return r;
}

VerifySequenceRequest VerifyReq(SeqId seq, std::vector<int32_t> catch_up, int64_t cached,
                                std::vector<int32_t> drafts, const SamplingParams& p, uint64_t seed,
                                int64_t prompt_len, int32_t M) {
  VerifySequenceRequest r;
  r.seq = seq;
  r.catch_up = std::move(catch_up);
  r.expected_cached_len = cached;
  r.drafts = std::move(drafts);
  r.sampling = p;
  r.seed = seed;
  r.prompt_len = prompt_len;
  r.num_candidates = M;
  return r;
}

// Collects the tokens per sequence from Draft's step callbacks.
struct DraftLog {
  std::map<SeqId, std::vector<DraftToken>> tokens;
  std::map<SeqId, absl::Status> failed;
  std::vector<int32_t> steps;
  int last_calls = 0;
  std::function<void(const DraftStep&)> Callback() {
    return [this](const DraftStep& s) {
      steps.push_back(s.step);
      for (const DraftToken& t : s.tokens) tokens[t.seq].push_back(t);
      for (const SequenceOutcome& f : s.failed) {
        EXPECT_FALSE(failed.contains(f.seq)) << "sequence " << f.seq << " reported twice";
        failed[f.seq] = f.status;
      }
      if (s.last) ++last_calls;
    };
  }
};

void ExpectDraftEquals(const std::vector<DraftToken>& got, const ExpectedDraft& want) {
  ASSERT_EQ(got.size(), want.tokens.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].token, want.tokens[k]) << "step " << k + 1;
    EXPECT_TRUE(SameBits(got[k].q_prob, want.q[k]))
        << "step " << k + 1 << ": " << got[k].q_prob << " vs " << want.q[k];
  }
}

void ExpectVerifyEquals(const VerifySequenceResult& got, const ExpectedVerify& want) {
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.position, want.position);
  EXPECT_TRUE(SameBits(got.p_draft, want.p_draft));
  EXPECT_EQ(got.argmax, want.argmax);
  EXPECT_EQ(got.bonus_token, want.bonus);
  EXPECT_EQ(got.candidate_tokens, want.candidates);
  ASSERT_EQ(got.candidate_probs.size(), want.candidate_p.size());
  for (size_t i = 0; i < want.candidate_p.size(); ++i) {
    EXPECT_TRUE(SameBits(got.candidate_probs[i], want.candidate_p[i])) << "position " << i + 1;
  }
}

std::vector<float> Densify(const ProbRow& kept, int64_t vocab) {
  absl::StatusOr<std::vector<float>> row = DensifyRow(kept, vocab, "kept");
  EXPECT_TRUE(row.ok()) << row.status();
  return row.ok() ? *row : std::vector<float>();
}

TEST_F(WorkerRuntimeTest, DraftFollowsTheDraftSampleStreamOverTwoRounds) {
  auto rt = Runtime();
  for (const SamplingParams& params : {Sampled(), EveryFilter()}) {
    const SeqId seq = params.top_k == 0 ? 1 : 2;
    const std::vector<int32_t> prompt = WorkerPrompt(21, static_cast<int>(seq));
    const uint64_t seed = 0x1234'5678'9abc'def0ULL + seq;
    constexpr int32_t K = 5;
    DraftLog log;
    const std::vector<SequenceOutcome> out =
        rt->Draft(Drafts{DraftReq(seq, prompt, 0, K, params, seed, 21)}, log.Callback());
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].status.ok()) << out[0].status;
    EXPECT_EQ(out[0].cached_len, 21 + K - 1);  // t_K is sampled, never fed
    EXPECT_EQ(log.steps, (std::vector<int32_t>{1, 2, 3, 4, 5}));
    EXPECT_EQ(log.last_calls, 1);
    const ExpectedDraft want = testing::ReferenceDraft(oracle_, prompt, 21, params, seed, K);
    ExpectDraftEquals(log.tokens[seq], want);
    for (int32_t k = 1; k <= K; ++k) {
      absl::StatusOr<ProbRow> kept = rt->ReadRow(seq, k);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_TRUE(SameBits(Densify(*kept, kVocab), want.rows[static_cast<size_t>(k - 1)]));
    }

    // The coordinator accepted 2 drafts and appended a correction; the worker keeps x[:23].
    const int32_t correction = 7;
    absl::StatusOr<TruncateResult> tr = rt->Truncate(Trunc(seq, 23));
    ASSERT_TRUE(tr.ok()) << tr.status();
    EXPECT_EQ(tr->cached_len, 23);
    std::vector<int32_t> x = prompt;
    x.insert(x.end(), want.tokens.begin(), want.tokens.begin() + 2);
    x.push_back(correction);
    DraftLog log2;
    const auto out2 =
        rt->Draft(Drafts{DraftReq(seq, {correction}, 23, 3, params, seed, 21)}, log2.Callback());
    ASSERT_TRUE(out2[0].status.ok()) << out2[0].status;
    ExpectDraftEquals(log2.tokens[seq], testing::ReferenceDraft(oracle_, x, 21, params, seed, 3));
    ASSERT_TRUE(rt->Release(seq).ok());
  }
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
}

TEST_F(WorkerRuntimeTest, GreedyDraftsArePointMasses) {
  auto rt = Runtime();
  const std::vector<int32_t> prompt = WorkerPrompt(9, 3);
  // Temperature 0, and DRAFT_SAMPLING_GREEDY over a filtered row.
  DraftSequenceRequest a = DraftReq(1, prompt, 0, 4, Greedy(), 5, 9);
  DraftSequenceRequest b = DraftReq(2, prompt, 0, 4, EveryFilter(), 5, 9);
  b.draft_sampling = DraftSampling::kGreedy;
  DraftLog log;
  const auto out = rt->Draft(std::vector<DraftSequenceRequest>{a, b}, log.Callback());
  ASSERT_TRUE(out[0].status.ok() && out[1].status.ok());
  ExpectDraftEquals(log.tokens[1], testing::ReferenceDraft(oracle_, prompt, 9, Greedy(), 5, 4));
  ExpectDraftEquals(log.tokens[2],
                    testing::ReferenceDraft(oracle_, prompt, 9, EveryFilter(), 5, 4, true));
  for (SeqId seq : {1, 2}) {
    for (const DraftToken& t : log.tokens[seq]) EXPECT_EQ(t.q_prob, 1.0f);
    absl::StatusOr<ProbRow> kept = rt->ReadRow(seq, 2);
    ASSERT_TRUE(kept.ok());
    EXPECT_FALSE(kept->dense());
    EXPECT_EQ(kept->ids, std::vector<int32_t>{log.tokens[seq][1].token});
    EXPECT_EQ(kept->probs, std::vector<float>{1.0f});
  }
}

TEST_F(WorkerRuntimeTest, VerifyMatchesTheTargetRowsAndStreams) {
  auto rt = Runtime();
  const std::vector<int32_t> prompt = WorkerPrompt(17, 4);
  const std::vector<int32_t> drafts = {11, 250, 3, 3};
  for (const SamplingParams& params : {Sampled(1.0f), EveryFilter(), Greedy()}) {
    const uint64_t seed = 99;
    std::vector<VerifySequenceResult> streamed;
    const auto out = rt->Verify(Verifies{VerifyReq(1, prompt, 0, drafts, params, seed, 17, 6)},
                                [&](const VerifySequenceResult& r) { streamed.push_back(r); });
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(streamed.size(), 1u);
    const ExpectedVerify want =
        testing::ReferenceVerify(oracle_, prompt, 17, drafts, params, seed, 6);
    ExpectVerifyEquals(out[0], want);
    ExpectVerifyEquals(streamed[0], want);
    EXPECT_EQ(out[0].cached_len, 17 + 4);
    if (params.greedy()) {
      EXPECT_TRUE(out[0].candidate_tokens.empty());
    }
    for (int32_t i = 1; i <= 5; ++i) {
      absl::StatusOr<ProbRow> kept = rt->ReadRow(1, i);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_TRUE(SameBits(Densify(*kept, kVocab), want.rows[static_cast<size_t>(i - 1)]));
    }
    // Truncate answers queries from the kept rows (p here; q on a draft worker).
    absl::StatusOr<TruncateResult> tr = rt->Truncate(Trunc(1, 19, 3, {0, 3, 299}));
    ASSERT_TRUE(tr.ok()) << tr.status();
    EXPECT_TRUE(SameBits(tr->q_probs,
                         std::vector<float>{want.rows[2][0], want.rows[2][3], want.rows[2][299]}));
    ASSERT_TRUE(rt->Release(1).ok());
  }
}

TEST_F(WorkerRuntimeTest, PlainDecodingEqualsDecodePlain) {
  // K = 0 rounds, one token at a time, are the in-process baseline exactly.
  for (const SamplingParams& params : {EveryFilter(), Greedy()}) {
    auto rt = Runtime();
    const std::vector<int32_t> prompt = WorkerPrompt(12, 8);
    DecodeRequest req;
    req.prompt = prompt;
    req.sampling = params;
    req.seed = 4242;
    req.max_new_tokens = 12;
    auto engine = Engine();
    absl::StatusOr<DecodeResult> plain = DecodePlain(*engine, 1, req);
    ASSERT_TRUE(plain.ok()) << plain.status();
    std::vector<int32_t> got;
    std::vector<int32_t> catch_up = prompt;
    int64_t cached = 0;
    for (int i = 0; i < 12; ++i) {
      const auto out =
          rt->Verify(Verifies{VerifyReq(7, catch_up, cached, {}, params, req.seed, 12, 0)});
      ASSERT_TRUE(out[0].status.ok()) << out[0].status;
      EXPECT_EQ(out[0].argmax.size(), 1u);
      got.push_back(out[0].bonus_token);
      cached = out[0].cached_len;
      catch_up.assign(1, out[0].bonus_token);
    }
    EXPECT_EQ(got, plain->tokens);
  }
}

class CountingObserver : public RuntimeObserver {
 public:
  void OnForward(ForwardKind kind, int64_t batch_size, int64_t tokens, absl::Duration) override {
    ++calls[kind];
    max_batch[kind] = std::max(max_batch[kind], batch_size);
    tokens_by_kind[kind] += tokens;
  }
  void OnKvChanged(const KvPool& kv) override { last_used_blocks = kv.used_blocks(); }
  void OnPrefixCache(int64_t queried, int64_t hit) override {
    queried_tokens += queried;
    hit_tokens += hit;
  }
  int64_t last_used_blocks = -1;
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
  std::map<ForwardKind, int> calls;
  std::map<ForwardKind, int64_t> max_batch;
  std::map<ForwardKind, int64_t> tokens_by_kind;
};

// WarmUp runs a throwaway call of either kind and takes it all back: no sequence, no block in use
// or cached (its 12 tokens fill no 16-token block), nothing reported to the observer; the calls
// after it give the oracle's tokens and rows, bit for bit. A worker whose sequences are too short
// to hold it is left cold and still serves.
TEST_F(WorkerRuntimeTest, WarmUpLeavesNoTraceAndChangesNoResult) {
  for (const bool draft : {true, false}) {
    SCOPED_TRACE(draft ? "draft" : "target");
    CountingObserver seen;
    auto rt = Runtime(4096, 0, &seen);
    ASSERT_TRUE(rt->WarmUp(draft).ok());
    EXPECT_EQ(rt->num_sequences(), 0);
    EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
    EXPECT_EQ(rt->engine().kv().cached_blocks(), 0);
    EXPECT_TRUE(seen.calls.empty());
    EXPECT_EQ(seen.queried_tokens, 0);
    EXPECT_EQ(seen.last_used_blocks, -1);

    const DraftSequenceRequest d = DraftReq(7, WorkerPrompt(20, 3), 0, 3, EveryFilter(), 41, 15);
    DraftLog log;
    rt->Draft(Drafts{d}, log.Callback());
    ExpectDraftEquals(log.tokens[7], testing::ReferenceDraft(oracle_, d.catch_up, d.prompt_len,
                                                             d.sampling, d.seed, 3));
    const std::vector<int32_t> prompt = WorkerPrompt(17, 4);
    const std::vector<int32_t> drafts = {11, 250, 3, 3};
    const auto out = rt->Verify(Verifies{VerifyReq(8, prompt, 0, drafts, Sampled(), 99, 17, 6)});
    ASSERT_EQ(out.size(), 1u);
    ExpectVerifyEquals(out[0],
                       testing::ReferenceVerify(oracle_, prompt, 17, drafts, Sampled(), 99, 6));
    EXPECT_EQ(seen.calls[ForwardKind::kVerify], 1);
  }
  auto small = Runtime(4096, /*max_seq_len=*/4);
  EXPECT_TRUE(small->WarmUp(false).ok());
  EXPECT_EQ(small->num_sequences(), 0);
  const auto out = small->Verify(Verifies{VerifyReq(1, {5}, 0, {9, 9}, Greedy(), 1, 1, 0)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].status.ok()) << out[0].status;
}

TEST_F(WorkerRuntimeTest, ChunkedCatchUpEqualsUnchunked) {
  // Prefix caching off: every chunk is computed, so the call counts are exact.
  CountingObserver chunked_obs;
  auto chunked = Runtime(4096, 0, &chunked_obs, /*prefix_caching=*/false);
  CountingObserver whole_obs;
  auto whole = Runtime(4096, 0, &whole_obs, /*prefix_caching=*/false);
  const std::vector<int32_t> long_prompt = WorkerPrompt(60, 1);
  const std::vector<int32_t> short_prompt = WorkerPrompt(5, 2);
  std::vector<VerifySequenceRequest> verify = {
      VerifyReq(1, long_prompt, 0, {4, 5, 6}, EveryFilter(), 1, 60, 3),
      VerifyReq(2, short_prompt, 0, {9}, Sampled(), 2, 5, 2)};
  const auto b = whole->Verify(verify);
  // At most 7 catch-up tokens per call: 60 = 7 * 8 + 4, so eight calls leave the long prompt
  // prefilling, and the ninth feeds the last 4 and verifies. The short one verifies at once.
  for (VerifySequenceRequest& r : verify) r.max_prefill_tokens = 7;
  const auto first = chunked->Verify(verify);
  ASSERT_TRUE(first[0].status.ok()) << first[0].status;
  EXPECT_TRUE(first[0].prefilling);
  EXPECT_EQ(first[0].cached_len, 7);
  EXPECT_TRUE(first[0].argmax.empty());
  EXPECT_FALSE(first[1].prefilling);
  std::vector<VerifySequenceResult> a = {first[0], first[1]};
  int prefilling_calls = 1;
  while (a[0].prefilling) {
    VerifySequenceRequest next = verify[0];
    next.catch_up.assign(long_prompt.begin() + a[0].cached_len, long_prompt.end());
    next.expected_cached_len = a[0].cached_len;
    a[0] = chunked->Verify(Verifies{next})[0];
    ASSERT_TRUE(a[0].status.ok()) << a[0].status;
    if (a[0].prefilling) ++prefilling_calls;
  }
  EXPECT_EQ(prefilling_calls, 8);
  for (size_t i = 0; i < 2; ++i) {
    ExpectVerifyEquals(a[i], testing::ReferenceVerify(oracle_, verify[i].catch_up,
                                                      verify[i].prompt_len, verify[i].drafts,
                                                      verify[i].sampling, verify[i].seed, 3 - i));
    ExpectVerifyEquals(b[i], testing::ReferenceVerify(oracle_, verify[i].catch_up,
                                                      verify[i].prompt_len, verify[i].drafts,
                                                      verify[i].sampling, verify[i].seed, 3 - i));
  }
  // The first call fed a chunk with the short sequence's verification; seven more fed chunks
  // alone (catch-up passes without logits), and the last verified.
  EXPECT_EQ(chunked_obs.calls[ForwardKind::kCatchUp], 7);
  EXPECT_EQ(chunked_obs.tokens_by_kind[ForwardKind::kCatchUp], 49);
  EXPECT_EQ(chunked_obs.calls[ForwardKind::kVerify], 2);
  EXPECT_EQ(chunked_obs.tokens_by_kind[ForwardKind::kVerify], 7 + 5 + 1 + 4 + 3);
  EXPECT_EQ(whole_obs.calls[ForwardKind::kCatchUp], 0);
  EXPECT_EQ(whole_obs.tokens_by_kind[ForwardKind::kVerify], 60 + 3 + 5 + 1);

  // Draft: the same, with a prefill_only call (the coordinator's round whose draft is behind)
  // that never feeds the last token.
  DraftLog la, lb;
  DraftSequenceRequest d = DraftReq(3, long_prompt, 0, 3, EveryFilter(), 8, 60);
  VerifySequenceRequest only = VerifyReq(4, long_prompt, 0, {}, EveryFilter(), 8, 60, 0);
  only.prefill_only = true;
  const auto held = chunked->Verify(Verifies{only});
  EXPECT_TRUE(held[0].prefilling);
  EXPECT_EQ(held[0].cached_len, 59);
  d.max_prefill_tokens = 40;
  const std::vector<SequenceOutcome> part = chunked->Draft(Drafts{d}, la.Callback());
  EXPECT_TRUE(part[0].status.ok());
  EXPECT_TRUE(part[0].prefilling);
  EXPECT_EQ(part[0].cached_len, 32);  // a chunk of 40 cut back to a block boundary
  EXPECT_TRUE(la.tokens[3].empty());
  EXPECT_EQ(la.steps, std::vector<int32_t>{0});
  d.catch_up.assign(long_prompt.begin() + 32, long_prompt.end());
  d.expected_cached_len = 32;
  const std::vector<SequenceOutcome> rest = chunked->Draft(Drafts{d}, la.Callback());
  EXPECT_FALSE(rest[0].prefilling);
  whole->Draft(Drafts{DraftReq(3, long_prompt, 0, 3, EveryFilter(), 8, 60)}, lb.Callback());
  const ExpectedDraft want = testing::ReferenceDraft(oracle_, long_prompt, 60, EveryFilter(), 8, 3);
  ExpectDraftEquals(la.tokens[3], want);
  ExpectDraftEquals(lb.tokens[3], want);
  EXPECT_EQ(chunked_obs.calls[ForwardKind::kDraftStep], 3);
  // The observer saw every change of KV usage, releases included.
  EXPECT_EQ(chunked_obs.last_used_blocks, 13);  // 63, 6, 59 and 62 tokens in blocks of 16
  ASSERT_TRUE(chunked->Release(1).ok());
  EXPECT_EQ(chunked_obs.last_used_blocks, 9);
  EXPECT_EQ(chunked_obs.queried_tokens, 0);  // no prefix cache, no queries
}

// The coordinator's pass budget may leave room for a sequence's prefill chunk only: a prefill_only
// Draft feeds all but the last catch-up token even when the whole catch-up is within its limit,
// drafts nothing, and the next call drafts exactly what one call would have.
TEST_F(WorkerRuntimeTest, APrefillOnlyDraftFeedsAllButTheLastTokenAndDraftsNothing) {
  auto runtime = Runtime();
  const std::vector<int32_t> prompt = WorkerPrompt(20, 3);
  DraftSequenceRequest d = DraftReq(5, prompt, 0, 3, EveryFilter(), 8, 20);
  d.prefill_only = true;
  DraftLog log;
  const std::vector<SequenceOutcome> held = runtime->Draft(Drafts{d}, log.Callback());
  ASSERT_TRUE(held[0].status.ok()) << held[0].status;
  EXPECT_TRUE(held[0].prefilling);
  EXPECT_EQ(held[0].cached_len, 19);
  EXPECT_TRUE(log.tokens[5].empty());
  d.prefill_only = false;
  d.catch_up = {prompt.back()};
  d.expected_cached_len = 19;
  const std::vector<SequenceOutcome> drafted = runtime->Draft(Drafts{d}, log.Callback());
  ASSERT_TRUE(drafted[0].status.ok()) << drafted[0].status;
  EXPECT_FALSE(drafted[0].prefilling);
  ExpectDraftEquals(log.tokens[5],
                    testing::ReferenceDraft(oracle_, prompt, 20, EveryFilter(), 8, 3));
}

TEST_F(WorkerRuntimeTest, BatchedSequencesEqualEachAlone) {
  std::vector<DraftSequenceRequest> drafts;
  for (int i = 0; i < 8; ++i) {
    SamplingParams p = i % 3 == 0   ? EveryFilter()
                       : i % 3 == 1 ? Sampled(0.5f + 0.1f * i)
                                    : Greedy();
    drafts.push_back(
        DraftReq(100 + i, WorkerPrompt(3 + 5 * i, i), 0, 1 + i % 4, p, 1000 + i, 2 + i));
  }
  auto batched = Runtime();
  DraftLog together;
  batched->Draft(drafts, together.Callback());
  // Steps stop when the longest K is done; every sequence got exactly its K tokens.
  EXPECT_EQ(together.steps, (std::vector<int32_t>{1, 2, 3, 4}));
  for (const DraftSequenceRequest& d : drafts) {
    auto alone = Runtime();
    DraftLog log;
    alone->Draft(Drafts{d}, log.Callback());
    ASSERT_EQ(together.tokens[d.seq].size(), static_cast<size_t>(d.num_speculative_tokens));
    ExpectDraftEquals(together.tokens[d.seq],
                      testing::ReferenceDraft(oracle_, d.catch_up, d.prompt_len, d.sampling, d.seed,
                                              d.num_speculative_tokens));
    ExpectDraftEquals(log.tokens[d.seq],
                      testing::ReferenceDraft(oracle_, d.catch_up, d.prompt_len, d.sampling, d.seed,
                                              d.num_speculative_tokens));
  }
}

TEST_F(WorkerRuntimeTest, PerSequenceErrorsAreIsolated) {
  // 6 blocks of 16 tokens and a max length of 48.
  auto rt = Runtime(6 * kBlock, 48);
  ASSERT_TRUE(rt->Verify(Verifies{VerifyReq(5, WorkerPrompt(10, 5), 0, {}, Greedy(), 0, 10, 0)})[0]
                  .status.ok());
  SamplingParams bad_params = Sampled();
  bad_params.top_p = 1.5f;
  const std::vector<VerifySequenceRequest> batch = {
      VerifyReq(1, WorkerPrompt(8, 1), 0, {1, 2}, EveryFilter(), 3, 8, 2),  // fine
      VerifyReq(2, {1}, 4, {}, Sampled(), 0, 0, 0),                         // unknown sequence
      VerifyReq(5, {1}, 3, {}, Sampled(), 0, 0, 0),                         // holds 10, not 3
      VerifyReq(3, {1, 300}, 0, {}, Sampled(), 0, 0, 0),                    // token out of range
      VerifyReq(4, WorkerPrompt(40, 2), 0, {1, 2, 3, 4, 5, 6, 7, 8, 9}, Sampled(), 0, 0,
                0),                                                  // > 48
      VerifyReq(6, WorkerPrompt(40, 3), 0, {}, Sampled(), 0, 0, 0),  // needs 3 blocks, 4 left
      VerifyReq(7, WorkerPrompt(40, 4), 0, {}, Sampled(), 0, 0, 0),  // ... then only 1 is left
      VerifyReq(1, {1}, 0, {}, Sampled(), 0, 0, 0),                  // duplicate id
      VerifyReq(8, {1}, 0, {}, bad_params, 0, 0, 0),                 // bad sampling params
      VerifyReq(9, {1}, 0, {1}, Sampled(), 0, 0, 65),                // M too large
      VerifyReq(10, {}, 0, {}, Sampled(), 0, 0, 0),                  // no catch-up
      VerifyReq(11, {1}, 0, {-1}, Sampled(), 0, 0, 0),               // draft out of range
  };
  std::vector<SeqId> order;
  const auto out =
      rt->Verify(batch, [&](const VerifySequenceResult& r) { order.push_back(r.seq); });
  ExpectVerifyEquals(out[0], testing::ReferenceVerify(oracle_, WorkerPrompt(8, 1), 8, {1, 2},
                                                      EveryFilter(), 3, 2));
  EXPECT_TRUE(out[5].status.ok()) << out[5].status;
  const std::vector<std::pair<absl::StatusCode, std::string>> want = {
      {absl::StatusCode::kOk, ""},
      {absl::StatusCode::kNotFound, "unknown sequence 2"},
      {absl::StatusCode::kFailedPrecondition,
       "coordinator expects 3 cached tokens, worker holds 10"},
      {absl::StatusCode::kInvalidArgument, "token id 300 at catch-up index 1 is outside [0, 300)"},
      {absl::StatusCode::kOutOfRange, "sequence 4 would reach 49 tokens, over max_seq_len 48"},
      {absl::StatusCode::kOk, ""},
      {absl::StatusCode::kResourceExhausted,
       "sequence 7 needs 3 more KV blocks for 40 tokens but only 1 are free"},
      {absl::StatusCode::kInvalidArgument, "sequence 1 appears more than once"},
      {absl::StatusCode::kInvalidArgument, "top_p"},
      {absl::StatusCode::kInvalidArgument, "num_candidates must be in [0, 64], got 65"},
      {absl::StatusCode::kInvalidArgument, "catch-up must hold at least the last committed token"},
      {absl::StatusCode::kInvalidArgument, "draft token -1 at step 1 is outside [0, 300)"},
  };
  ASSERT_EQ(out.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(out[i].status.code(), want[i].first) << i << ": " << out[i].status;
    EXPECT_THAT(std::string(out[i].status.message()), HasSubstr(want[i].second)) << i;
  }
  // Rejected sequences are reported before the forward pass; the rest in request order.
  EXPECT_EQ(order.size(), batch.size());
  EXPECT_EQ(order[order.size() - 2], 1u);
  EXPECT_EQ(order.back(), 6u);
  EXPECT_EQ(out[2].cached_len, 10);  // untouched

  // Draft reports the same kinds of errors once each, and drafts the rest.
  DraftLog log;
  const auto dout = rt->Draft(
      Drafts{DraftReq(5, {1}, 10, 2, Sampled(), 1, 10), DraftReq(2, {1}, 4, 2, Sampled(), 1, 0),
             DraftReq(12, {1}, 0, 0, Sampled(), 1, 0), DraftReq(13, {1}, 0, 65, Sampled(), 1, 0)},
      log.Callback());
  EXPECT_TRUE(dout[0].status.ok()) << dout[0].status;
  EXPECT_EQ(dout[1].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dout[2].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dout[3].status.message()),
              HasSubstr("num_speculative_tokens must be in [1, 64], got 65"));
  EXPECT_EQ(log.failed.size(), 3u);
  EXPECT_EQ(log.tokens[5].size(), 2u);
  EXPECT_EQ(dout[0].cached_len, 12);
}

TEST_F(WorkerRuntimeTest, DraftWithNothingToDraftStillReportsOnce) {
  auto rt = Runtime();
  DraftLog log;
  const auto out = rt->Draft(Drafts{DraftReq(1, {1}, 3, 2, Sampled(), 1, 0)}, log.Callback());
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(log.steps, std::vector<int32_t>{0});
  EXPECT_EQ(log.last_calls, 1);
  EXPECT_EQ(log.failed.size(), 1u);
}

TEST_F(WorkerRuntimeTest, TruncateAndReadRowErrors) {
  auto rt = Runtime();
  EXPECT_EQ(rt->Truncate(Trunc(1, 0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt->ReadRow(1, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt->Release(1).code(), absl::StatusCode::kNotFound);
  DraftLog log;
  ASSERT_TRUE(
      rt->Draft(Drafts{DraftReq(1, WorkerPrompt(20, 1), 0, 3, Sampled(), 1, 20)}, log.Callback())[0]
          .status.ok());
  absl::StatusOr<TruncateResult> bad_step = rt->Truncate(Trunc(1, 20, 4, {1}));
  EXPECT_EQ(bad_step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad_step.status().message()), HasSubstr("no kept row for query_step 4"));
  EXPECT_EQ(rt->Truncate(Trunc(1, 20, 1, {300})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt->Truncate(Trunc(1, -1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*rt->CachedLength(1), 22);  // nothing truncated by the failed calls
  EXPECT_EQ(rt->ReadRow(1, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rt->ReadRow(1, 4).status().code(), absl::StatusCode::kFailedPrecondition);
  // Idempotent, and never grows.
  EXPECT_EQ(rt->Truncate(Trunc(1, 21))->cached_len, 21);
  EXPECT_EQ(rt->Truncate(Trunc(1, 21))->cached_len, 21);
  EXPECT_EQ(rt->Truncate(Trunc(1, 100))->cached_len, 21);
  // Rows stay readable after Truncate, until the next Draft.
  EXPECT_TRUE(rt->ReadRow(1, 3).ok());
  EXPECT_EQ(rt->engine().kv().used_blocks(), 2);
  EXPECT_EQ(rt->Truncate(Trunc(1, 16))->cached_len, 16);
  EXPECT_EQ(rt->engine().kv().used_blocks(), 1);
}

// drop_tail folds the previous round's Truncate into the next Verify: the result is that of a
// worker that never saw the rejected drafts, and only a surplus is ever dropped.
TEST_F(WorkerRuntimeTest, DropTailIsATruncateFoldedIntoTheNextCall) {
  const std::vector<int32_t> prompt = WorkerPrompt(14, 3);
  auto rt = Runtime();
  ASSERT_TRUE(
      rt->Verify(Verifies{VerifyReq(1, prompt, 0, {4, 5, 6}, Greedy(), 0, 14, 0)})[0].status.ok());
  ASSERT_EQ(*rt->CachedLength(1), 17);  // the prompt and three drafts
  // The round kept one draft (4) and appended a correction (9): x has 16 tokens, the worker
  // should keep 15 of its 17 and catch up from there.
  std::vector<int32_t> x = prompt;
  x.push_back(4);
  x.push_back(9);
  VerifySequenceRequest next = VerifyReq(1, {9}, 15, {7, 8}, Greedy(), 0, 14, 0);
  const auto stale = rt->Verify(Verifies{next});
  EXPECT_EQ(stale[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*rt->CachedLength(1), 17);  // a refused call changes nothing
  VerifySequenceRequest too_long = next;
  too_long.expected_cached_len = 18;
  too_long.drop_tail = true;
  EXPECT_EQ(rt->Verify(Verifies{too_long})[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*rt->CachedLength(1), 17);
  next.drop_tail = true;
  const auto folded = rt->Verify(Verifies{next});
  ASSERT_TRUE(folded[0].status.ok()) << folded[0].status;
  EXPECT_EQ(*rt->CachedLength(1), 18);  // 15 kept + 9, 7, 8
  EXPECT_EQ(folded[0].position, 16);

  auto fresh = Runtime();
  const auto reference = fresh->Verify(Verifies{VerifyReq(1, x, 0, {7, 8}, Greedy(), 0, 14, 0)});
  ASSERT_TRUE(reference[0].status.ok());
  EXPECT_EQ(folded[0].argmax, reference[0].argmax);
  EXPECT_EQ(folded[0].bonus_token, reference[0].bonus_token);
  EXPECT_EQ(rt->engine().kv().used_blocks(), fresh->engine().kv().used_blocks());
}

TEST_F(WorkerRuntimeTest, RandomizedSessionReturnsEveryBlock) {
  // Without prefix caching no two sequences share a block, so the count below is exact.
  auto rt = Runtime(8192, 0, nullptr, /*prefix_caching=*/false);
  std::mt19937 rng(7);
  struct Seq {
    std::vector<int32_t> x;        // committed tokens
    int64_t cached = 0;            // what the worker holds
    int64_t committed_before = 0;  // len(x) before this round
  };
  std::map<SeqId, Seq> live;
  SeqId next = 1;
  auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 60; ++round) {
    if (live.size() < 6 && rand(0, 2) == 0) live[next++].x = WorkerPrompt(rand(1, 40), rand(0, 99));
    std::vector<DraftSequenceRequest> drafts;
    std::vector<VerifySequenceRequest> verifies;
    for (auto& [id, s] : live) {
      s.committed_before = static_cast<int64_t>(s.x.size());
      std::vector<int32_t> catch_up(s.x.begin() + s.cached, s.x.end());
      // Sometimes a chunked prefill: at most that many catch-up tokens per call.
      const int64_t chunk = rand(0, 1) == 0 ? 0 : rand(1, 20);
      if (rand(0, 1) == 0) {
        drafts.push_back(DraftReq(id, catch_up, s.cached, rand(1, 5), EveryFilter(), id, 1));
        drafts.back().max_prefill_tokens = chunk;
      } else {
        std::vector<int32_t> d(static_cast<size_t>(rand(0, 4)), static_cast<int32_t>(rand(0, 299)));
        verifies.push_back(VerifyReq(id, catch_up, s.cached, d, Sampled(), id, 1, 2));
        verifies.back().max_prefill_tokens = chunk;
      }
    }
    for (const SequenceOutcome& o : rt->Draft(drafts)) {
      ASSERT_TRUE(o.status.ok()) << o.status;
      live[o.seq].cached = o.cached_len;
      // A correction token, unless the call only fed a prefill chunk.
      if (!o.prefilling) live[o.seq].x.push_back(static_cast<int32_t>(rand(0, 299)));
    }
    for (const VerifySequenceResult& r : rt->Verify(verifies)) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      live[r.seq].cached = r.cached_len;
      if (!r.prefilling) live[r.seq].x.push_back(r.bonus_token);
    }
    // Accept a random prefix: truncate into the part the worker holds as committed (the bonus
    // token just appended to x is not in its cache), as a rejection does.
    for (auto it = live.begin(); it != live.end();) {
      Seq& s = it->second;
      const int64_t agreed = std::min<int64_t>(s.cached, s.committed_before);
      const int64_t keep = rand(0, static_cast<int>(agreed));
      absl::StatusOr<TruncateResult> tr = rt->Truncate(Trunc(it->first, keep));
      ASSERT_TRUE(tr.ok()) << tr.status();
      s.cached = tr->cached_len;
      if (s.x.size() > 150 || rand(0, 9) == 0) {
        ASSERT_TRUE(rt->Release(it->first).ok());
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    int64_t blocks = 0;
    for (const auto& [id, s] : live) blocks += (s.cached + kBlock - 1) / kBlock;
    ASSERT_EQ(rt->engine().kv().used_blocks(), blocks) << "round " << round;
  }
  for (const auto& [id, s] : live) ASSERT_TRUE(rt->Release(id).ok());
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
  EXPECT_EQ(rt->num_sequences(), 0);
}

}  // namespace
}  // namespace specd
