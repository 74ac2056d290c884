// Round trips through the worker protocol's one codec: every C++ value survives Encode then
// Decode unchanged, and the wire form carries what worker.proto documents (checked on the proto
// fields directly, so the codec is not its own reference).
#include "services/common/worker_codec.h"

#include <cmath>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace specd {
namespace {

namespace pb = ::specd::worker::v1;

SamplingParams Unusual() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = -0.5f;
  p.frequency_penalty = 0.25f;
  return p;
}

template <typename Request>
void FillCommon(Request& r) {
  r.seq = 0x1234567890abULL;
  r.catch_up = {1, 2, 3, 511};
  r.expected_cached_len = 17;
  r.sampling = Unusual();
  r.seed = 0xfedcba9876543210ULL;
  r.prompt_len = 9;
  r.drop_tail = true;
  r.max_prefill_tokens = 512;
  r.sample = 3;
}

TEST(WorkerCodecTest, SamplingParamsCrossAsTheyAre) {
  SamplingParams p = Unusual();
  pb::SamplingParams wire;
  codec::Encode(p, &wire);
  EXPECT_FLOAT_EQ(wire.top_p(), 0.9f);
  EXPECT_EQ(codec::Decode(wire), p);
  // No hidden defaults in the internal protocol: a zero is a zero (and the runtime rejects it).
  EXPECT_EQ(codec::Decode(pb::SamplingParams()).top_p, 0.0f);
  EXPECT_EQ(codec::Decode(pb::SamplingParams()).repetition_penalty, 0.0f);
}

TEST(WorkerCodecTest, DraftRequestRoundTrip) {
  DraftSequenceRequest r;
  FillCommon(r);
  r.num_speculative_tokens = 7;
  r.draft_sampling = DraftSampling::kGreedy;
  pb::DraftSequence wire;
  codec::Encode(r, &wire);
  EXPECT_EQ(wire.num_speculative_tokens(), 7);
  EXPECT_EQ(wire.draft_sampling(), pb::DRAFT_SAMPLING_GREEDY);
  EXPECT_EQ(wire.catch_up_tokens_size(), 4);
  EXPECT_TRUE(wire.drop_tail());
  EXPECT_EQ(wire.max_prefill_tokens(), 512);
  EXPECT_FALSE(wire.prefill_only());
  EXPECT_EQ(codec::Decode(wire), r);
  r.draft_sampling = DraftSampling::kProbabilistic;
  r.prefill_only = true;  // the pass budget left room for a prefill chunk only
  wire.Clear();
  codec::Encode(r, &wire);
  EXPECT_TRUE(wire.prefill_only());
  EXPECT_EQ(codec::Decode(wire), r);
}

// Issue 17's fields: a tree shape, EGAG's stop, a pending KV compaction, tree parents, leaf
// bonuses and step entropies.
TEST(WorkerCodecTest, TreeEgagAndCompactionFieldsRoundTrip) {
  DraftSequenceRequest d;
  FillCommon(d);
  d.num_speculative_tokens = 4;
  d.tree = {3, 2};
  d.entropy_stop = {true, 2, 0.625f};
  d.compact = {40, {1, 4, 9}};
  pb::DraftSequence dwire;
  codec::Encode(d, &dwire);
  EXPECT_EQ(dwire.tree().branching(), 3);
  EXPECT_EQ(dwire.tree().depth(), 2);
  EXPECT_TRUE(dwire.egag());
  EXPECT_EQ(dwire.egag_min_tokens(), 2);
  EXPECT_FLOAT_EQ(dwire.egag_threshold(), 0.625f);
  EXPECT_EQ(dwire.compact().tree_start(), 40);
  EXPECT_EQ(dwire.compact().kept_nodes_size(), 3);
  EXPECT_EQ(codec::Decode(dwire), d);
  // Unset on the wire is off in C++, whatever the other EGAG fields hold.
  dwire.set_egag(false);
  EXPECT_EQ(codec::Decode(dwire).entropy_stop, EntropyStop());
  EXPECT_FALSE(codec::Decode(pb::DraftSequence()).tree.is_tree());

  VerifySequenceRequest v;
  FillCommon(v);
  v.drafts = {5, 6, 7, 8};
  v.tree_parents = {-1, -1, 0, 1};
  v.compact = {12, {0, 2}};
  pb::VerifySequence vwire;
  codec::Encode(v, &vwire);
  EXPECT_EQ(vwire.tree_parents_size(), 4);
  EXPECT_EQ(vwire.tree_parents(1), -1);
  EXPECT_EQ(codec::Decode(vwire), v);

  VerifySequenceResult r;
  r.seq = 4;
  r.p_draft = {0.5f, 0.25f, 0.125f, 1.0f};
  r.argmax = {1, 2, 3, 4, 5};
  r.leaf_bonus = {77, 78};
  r.candidate_tokens = {{7, 8}, {9, 10}, {11, 12}};
  r.candidate_probs = {{0.1f, 0.2f}, {0.3f, 0.4f}, {0.5f, 0.6f}};
  pb::VerifyResult rwire;
  codec::Encode(r, KvFree{}, &rwire);
  EXPECT_EQ(rwire.leaf_bonus_tokens_size(), 2);
  EXPECT_EQ(codec::Decode(rwire, 0), r);

  const std::vector<DraftToken> tokens = {{1, 5, 1.0f, 0.75f}};
  DraftStep step;
  step.step = 1;
  step.tokens = tokens;
  step.last = true;
  pb::DraftResponse resp;
  codec::Encode(step, KvFree{}, &resp);
  EXPECT_FLOAT_EQ(resp.steps(0).tokens(0).entropy(), 0.75f);
  EXPECT_EQ(codec::Decode(resp).front().tokens, tokens);
}

TEST(WorkerCodecTest, VerifyRequestRoundTrip) {
  VerifySequenceRequest r;
  FillCommon(r);
  r.drafts = {5, 6, 7};
  r.num_candidates = 4;
  pb::VerifySequence wire;
  codec::Encode(r, &wire);
  EXPECT_EQ(wire.draft_tokens_size(), 3);
  EXPECT_EQ(wire.max_prefill_tokens(), 512);
  EXPECT_FALSE(wire.prefill_only());
  EXPECT_EQ(wire.sample(), 3u);
  EXPECT_EQ(wire.logprobs().mode(), pb::LOGPROBS_MODE_UNSPECIFIED);
  EXPECT_EQ(codec::Decode(wire), r);
  // A round whose draft is still prefilling: catch-up only.
  r.drafts.clear();
  r.num_candidates = 0;
  r.prefill_only = true;
  wire.Clear();
  codec::Encode(r, &wire);
  EXPECT_TRUE(wire.prefill_only());
  EXPECT_EQ(codec::Decode(wire), r);
  for (const LogprobsMode mode : {LogprobsMode::kRaw, LogprobsMode::kProcessed}) {
    r.logprobs = {mode, 5};
    wire.Clear();
    codec::Encode(r, &wire);
    EXPECT_EQ(wire.logprobs().mode(),
              mode == LogprobsMode::kRaw ? pb::LOGPROBS_MODE_RAW : pb::LOGPROBS_MODE_PROCESSED);
    EXPECT_EQ(wire.logprobs().top_n(), 5);
    EXPECT_EQ(codec::Decode(wire), r);
  }
}

TEST(WorkerCodecTest, LogprobQueriesAndAnswersRoundTrip) {
  const std::vector<LogprobQuery> queries = {{1, 2, {7}}, {5, 1, {8, 9}}};
  pb::QueryLogprobsRequest wire;
  codec::Encode(queries, &wire);
  ASSERT_EQ(wire.queries_size(), 2);
  EXPECT_EQ(wire.queries(1).tokens_size(), 2);
  EXPECT_EQ(codec::Decode(wire), queries);
  EXPECT_TRUE(codec::Validate(wire).ok());
  EXPECT_FALSE(codec::Validate(pb::QueryLogprobsRequest()).ok());
  const SequenceAnswer<std::vector<float>> answer{1, std::vector<float>{-0.5f, -INFINITY}};
  pb::LogprobAnswer answer_wire;
  codec::Encode(answer, &answer_wire);
  EXPECT_EQ(answer_wire.logprobs(1), -INFINITY);
  EXPECT_EQ(codec::Decode(answer_wire), answer);
  const SequenceAnswer<std::vector<float>> failed{2, absl::FailedPreconditionError("no row")};
  pb::LogprobAnswer failed_wire;
  codec::Encode(failed, &failed_wire);
  EXPECT_EQ(codec::Decode(failed_wire), failed);
}

TEST(WorkerCodecTest, TruncateAndReadRowsRequestsRoundTrip) {
  // The last one is guided: its companion's length travels too, and 0 is not "unset".
  const std::vector<TruncateSequenceRequest> truncates = {
      {1, 10, 2, {4, 5}, std::nullopt}, {2, 0, 0, {}, std::nullopt}, {3, 7, 0, {}, 0}};
  pb::TruncateRequest wire;
  codec::Encode(truncates, &wire);
  ASSERT_EQ(wire.sequences_size(), 3);
  EXPECT_EQ(wire.sequences(0).query_tokens_size(), 2);
  EXPECT_FALSE(wire.sequences(1).has_companion_new_len());
  EXPECT_TRUE(wire.sequences(2).has_companion_new_len());
  EXPECT_EQ(codec::Decode(wire), truncates);
  const std::vector<RowQuery> rows = {{3, 1}, {4, 5}};
  pb::ReadRowsRequest rows_wire;
  codec::Encode(rows, &rows_wire);
  EXPECT_EQ(codec::Decode(rows_wire), rows);
}

TEST(WorkerCodecTest, VerifyResultRoundTrip) {
  VerifySequenceResult r;
  r.seq = 9;
  r.position = 33;
  r.p_draft = {0.5f, 0.25f};
  r.argmax = {1, 2, 3};
  r.bonus_token = 42;
  r.candidate_tokens = {{7, 8}, {9, 10}};
  r.candidate_probs = {{0.1f, 0.2f}, {0.3f, 0.4f}};
  r.cached_len = 36;
  r.forward_ns = 123456;
  r.logprobs = {{{3, 1}, {-0.1f, -2.0f}, {5, 3}, {-4.0f, -0.1f}},
                {{2}, {-0.3f}, {2, 9}, {-0.3f, -INFINITY}},
                {{}, {}, {42}, {-1.5f}}};
  pb::VerifyResult wire;
  codec::Encode(r, KvFree{11, 176}, &wire);
  EXPECT_EQ(wire.cache().free_kv_blocks(), 11);
  EXPECT_EQ(wire.cache().free_kv_tokens(), 176);
  ASSERT_EQ(wire.logprobs_size(), 3);
  EXPECT_EQ(wire.logprobs(1).token_logprobs(1), -INFINITY);
  EXPECT_EQ(codec::Decode(wire, r.forward_ns), r);
  EXPECT_EQ(codec::DecodeKvFree(wire.cache()), (KvFree{11, 176}));

  VerifySequenceResult failed;
  failed.seq = 10;
  failed.status = absl::NotFoundError("unknown sequence 10");
  pb::VerifyResult failed_wire;
  codec::Encode(failed, KvFree{}, &failed_wire);
  EXPECT_EQ(failed_wire.status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(codec::Decode(failed_wire, 0), failed);

  // Only a prefill chunk was fed: the cache state says so, and nothing else is sent.
  VerifySequenceResult chunk;
  chunk.seq = 11;
  chunk.cached_len = 512;
  chunk.forward_ns = 777;
  chunk.prefilling = true;
  pb::VerifyResult chunk_wire;
  codec::Encode(chunk, KvFree{4, 64}, &chunk_wire);
  EXPECT_TRUE(chunk_wire.cache().prefilling());
  EXPECT_EQ(chunk_wire.cache().cached_len(), 512);
  EXPECT_EQ(chunk_wire.argmax_size(), 0);
  EXPECT_EQ(codec::Decode(chunk_wire, chunk.forward_ns), chunk);
}

TEST(WorkerCodecTest, DraftStepsRoundTrip) {
  const std::vector<DraftToken> first_tokens = {{1, 5, 0.5f}, {2, 6, 0.125f}};
  const std::vector<SequenceOutcome> failed = {{3, absl::InvalidArgumentError("bad"), 0}};
  const std::vector<DraftToken> last_tokens = {{1, 9, 1.0f}};
  // Sequence 4 only fed a prefill chunk: it drafted nothing and is in no step's token list.
  const std::vector<SequenceOutcome> outcomes = {
      {1, absl::OkStatus(), 12}, {2, {}, 11}, {3, {}, 0}, {4, {}, 256, true}};
  DraftStep first;
  first.step = 1;
  first.tokens = first_tokens;
  first.failed = failed;
  first.forward_ns = 999;
  DraftStep last;
  last.step = 2;
  last.tokens = last_tokens;
  last.last = true;
  last.outcomes = outcomes;
  last.forward_ns = 888;
  pb::DraftResponse wire;
  codec::Encode(first, KvFree{3, 48}, &wire);
  codec::Encode(last, KvFree{3, 48}, &wire);
  ASSERT_EQ(wire.steps_size(), 2);
  EXPECT_EQ(wire.steps(0).tokens_size(), 3);  // the failure rides in the token list with its status
  EXPECT_EQ(wire.cache_size(), 4);            // every sequence, once, from the last step
  EXPECT_TRUE(wire.cache(3).state().prefilling());
  const std::vector<codec::DecodedDraftStep> decoded = codec::Decode(wire);
  ASSERT_EQ(decoded.size(), 2u);
  EXPECT_EQ(decoded[0].step, 1);
  EXPECT_EQ(decoded[0].forward_ns, 999);
  EXPECT_EQ(decoded[0].tokens, first_tokens);
  EXPECT_EQ(decoded[0].failed, failed);
  EXPECT_TRUE(decoded[0].outcomes.empty());
  EXPECT_FALSE(decoded[0].has_free);
  EXPECT_EQ(decoded[1].step, 2);
  EXPECT_EQ(decoded[1].tokens, last_tokens);
  EXPECT_EQ(decoded[1].outcomes, outcomes);
  EXPECT_TRUE(decoded[1].has_free);
  EXPECT_EQ(decoded[1].free, (KvFree{3, 48}));
}

// Classifier-free guidance: a companion crosses with its sequence, its cached length comes back
// in every cache state, and a truncate of a guided sequence carries the companion's length (an
// unset one stays unset, which the runtime tells apart from 0).
TEST(WorkerCodecTest, CompanionsRoundTrip) {
  VerifySequenceRequest v;
  FillCommon(v);
  v.drafts = {5, 6};
  v.companion = CompanionRequest{0x8000000000000005ULL, 7.5f, {1, 2, 5}, 3};
  pb::VerifySequence v_wire;
  codec::Encode(v, &v_wire);
  ASSERT_TRUE(v_wire.has_companion());
  EXPECT_EQ(v_wire.companion().seq_id(), 0x8000000000000005ULL);
  EXPECT_FLOAT_EQ(v_wire.companion().scale(), 7.5f);
  EXPECT_EQ(v_wire.companion().catch_up_tokens_size(), 3);
  EXPECT_EQ(v_wire.companion().expected_cached_len(), 3);
  EXPECT_EQ(codec::Decode(v_wire), v);
  DraftSequenceRequest d;
  FillCommon(d);
  d.companion = CompanionRequest{77, 0.5f, {9}, 0};
  pb::DraftSequence d_wire;
  codec::Encode(d, &d_wire);
  EXPECT_EQ(codec::Decode(d_wire), d);
  d.companion.reset();
  d_wire.Clear();
  codec::Encode(d, &d_wire);
  EXPECT_FALSE(d_wire.has_companion());

  std::vector<TruncateSequenceRequest> truncates(2);
  truncates[0].seq = 1;
  truncates[0].new_len = 10;
  truncates[0].companion_new_len = 0;
  truncates[1].seq = 2;
  truncates[1].new_len = 4;
  pb::TruncateRequest t_wire;
  codec::Encode(truncates, &t_wire);
  EXPECT_TRUE(t_wire.sequences(0).has_companion_new_len());
  EXPECT_FALSE(t_wire.sequences(1).has_companion_new_len());
  EXPECT_EQ(codec::Decode(t_wire), truncates);

  VerifySequenceResult r;
  r.seq = 9;
  r.argmax = {3};
  r.cached_len = 36;
  r.companion_cached_len = 40;
  pb::VerifyResult r_wire;
  codec::Encode(r, KvFree{1, 16}, &r_wire);
  EXPECT_EQ(r_wire.cache().companion_cached_len(), 40);
  EXPECT_EQ(codec::Decode(r_wire, 0), r);
  const SequenceAnswer<TruncateResult> answer{5, TruncateResult{12, {}, 20}};
  pb::TruncateResult a_wire;
  codec::Encode(answer, KvFree{}, &a_wire);
  EXPECT_EQ(codec::Decode(a_wire), answer);
  const std::vector<SequenceOutcome> outcomes = {{1, absl::OkStatus(), 12, false, 8}};
  DraftStep last;
  last.step = 1;
  last.last = true;
  last.outcomes = outcomes;
  pb::DraftResponse s_wire;
  codec::Encode(last, KvFree{}, &s_wire);
  EXPECT_EQ(codec::Decode(s_wire)[0].outcomes, outcomes);

  // A sequence's companion id is fed once per pass: it may name no other sequence of the call.
  pb::VerifyRequest clash;
  clash.add_sequences()->set_seq_id(1);
  pb::VerifySequence* second = clash.add_sequences();
  second->set_seq_id(2);
  second->mutable_companion()->set_seq_id(1);
  EXPECT_EQ(
      codec::Validate(clash).message(),
      "Verify: seq_id 2 names companion.seq_id 1, which another sequence of the request uses");
}

TEST(WorkerCodecTest, SequenceAnswersRoundTrip) {
  const SequenceAnswer<TruncateResult> ok{5, TruncateResult{12, {0.25f, 0.0f}}};
  pb::TruncateResult wire;
  codec::Encode(ok, KvFree{1, 16}, &wire);
  EXPECT_EQ(codec::Decode(wire), ok);
  const SequenceAnswer<TruncateResult> bad{6, absl::FailedPreconditionError("no kept row")};
  wire.Clear();
  codec::Encode(bad, KvFree{}, &wire);
  EXPECT_EQ(codec::Decode(wire), bad);

  const SequenceAnswer<ProbRow> sparse{7, ProbRow{{2, 9}, {0.75f, 0.25f}}};
  pb::KeptRow row;
  codec::Encode(sparse, 30, KvFree{2, 32}, &row);
  EXPECT_FALSE(row.dense());
  EXPECT_EQ(row.cache().cached_len(), 30);
  EXPECT_EQ(codec::Decode(row), sparse);
  const SequenceAnswer<ProbRow> dense{8, ProbRow{{}, {0.5f, 0.0f, 0.5f}}};
  row.Clear();
  codec::Encode(dense, 30, KvFree{}, &row);
  EXPECT_TRUE(row.dense());
  EXPECT_EQ(codec::Decode(row), dense);
}

TEST(WorkerCodecTest, ValidateRejectsWholeCallProblemsNamingThem) {
  pb::DraftRequest draft;
  EXPECT_EQ(codec::Validate(draft).message(), "Draft: the request has no sequences");
  pb::DraftSequence* s = draft.add_sequences();
  s->set_seq_id(1);
  s->set_num_speculative_tokens(kMaxSpeculativeTokens + 1);
  EXPECT_EQ(codec::Validate(draft).message(),
            "Draft: seq_id 1 asks for num_speculative_tokens 65, at most 64 are allowed");
  s->set_num_speculative_tokens(4);
  s->set_draft_sampling(static_cast<pb::DraftSampling>(7));
  EXPECT_EQ(codec::Validate(draft).message(),
            "Draft: seq_id 1 has draft_sampling 7, which is not a DraftSampling value");
  s->set_draft_sampling(pb::DRAFT_SAMPLING_GREEDY);
  EXPECT_TRUE(codec::Validate(draft).ok());
  *draft.add_sequences() = *s;
  EXPECT_EQ(codec::Validate(draft).message(),
            "Draft: seq_id 1 appears more than once in the request");

  pb::VerifyRequest verify;
  pb::VerifySequence* v = verify.add_sequences();
  v->set_num_candidates(kMaxCandidates + 1);
  EXPECT_EQ(codec::Validate(verify).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec::Validate(pb::TruncateRequest()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec::Validate(pb::ReadRowsRequest()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
