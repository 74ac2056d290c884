// Real draft and target worker processes on loopback, driven by a test client, against the
// in-process oracle of tests/common/worker/worker_reference.h: probabilities bit for bit,
// draft tokens, candidates and bonus tokens exactly as the Philox streams pick them, batch
// invariance over the wire, and every KV block returned after a long randomized session.
// Each model kind (a synthetic checkpoint, stories260K) gets one worker pair for the suite.
#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/llama_engine.h"
#include "common/model/checkpoint.h"
#include "common/protocol/worker_protocol.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/weights_fingerprint.h"
#include "tests/common/worker/worker_reference.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd::testing {
namespace {

using ::testing::HasSubstr;

SamplingParams Params(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f,
                      float repetition = 1.0f, float presence = 0.0f, float frequency = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repetition;
  p.presence_penalty = presence;
  p.frequency_penalty = frequency;
  return p;
}

// Sixteen different processed distributions: greedy, plain, each filter, each penalty.
SamplingParams Variety(int i) {
  switch (i % 8) {
    case 0:
      return Params(0.0f);
    case 1:
      return Params(1.0f);
    case 2:
      return Params(0.7f, 20);
    case 3:
      return Params(1.3f, 0, 0.8f);
    case 4:
      return Params(0.9f, 0, 1.0f, 0.05f);
    case 5:
      return Params(0.8f, 50, 0.95f, 0.0f, 1.3f);
    case 6:
      return Params(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.5f, 0.4f);
    default:
      return Params(0.0f, 0, 1.0f, 0.0f, 1.5f, 0.0f, 0.3f);
  }
}

std::vector<int32_t> Prompt(int n, int salt, int64_t vocab) {
  std::vector<int32_t> t = {1};  // BOS
  for (int i = 1; i < n; ++i) {
    t.push_back(static_cast<int32_t>((i * 53 + salt * 97 + 11) % (vocab - 3) + 3));
  }
  return t;
}

std::unique_ptr<LlamaEngine> OracleEngine(const std::filesystem::path& dir, int64_t exit_layer) {
  EngineOptions options;
  options.kv_capacity_tokens = 2048;
  LoadOptions load;
  load.exit_layer = exit_layer;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(dir, 1, options, load);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// One worker pair and its oracles per model kind, started on first use.
struct Workers {
  ScopedTempDir tmp;
  std::filesystem::path model;
  int64_t vocab = 0;
  int64_t exit_layer = 0;
  std::unique_ptr<ChildProcess> draft;
  std::unique_ptr<ChildProcess> target;
  std::unique_ptr<pb::DraftWorker::Stub> draft_stub;
  std::unique_ptr<pb::TargetWorker::Stub> target_stub;
  std::unique_ptr<RowOracle> draft_oracle;
  std::unique_ptr<RowOracle> target_oracle;
};

class WorkerServiceTest : public ::testing::TestWithParam<ModelKind> {
 protected:
  static void TearDownTestSuite() { pairs().clear(); }

  void SetUp() override {
    if (GetParam() == ModelKind::kStories260K) {
      SPECD_REQUIRE_SHARED_DIR(shared);
      (void)shared;
    }
    std::unique_ptr<Workers>& w = pairs()[GetParam()];
    if (w == nullptr) {
      auto fresh = std::make_unique<Workers>();
      fresh->model = fresh->tmp.path() / "model";
      const absl::Status st = PrepareModel(GetParam(), fresh->model);
      ASSERT_TRUE(st.ok()) << st;
      fresh->exit_layer = DraftExitLayer(GetParam());
      absl::StatusOr<std::unique_ptr<ChildProcess>> draft = ChildProcess::Start(
          DraftWorkerBinary(),
          WorkerArgs(fresh->model, {"--exit-layer", std::to_string(fresh->exit_layer)}));
      ASSERT_TRUE(draft.ok()) << draft.status();
      absl::StatusOr<std::unique_ptr<ChildProcess>> target =
          ChildProcess::Start(TargetWorkerBinary(), WorkerArgs(fresh->model));
      ASSERT_TRUE(target.ok()) << target.status();
      fresh->draft = *std::move(draft);
      fresh->target = *std::move(target);
      fresh->draft_stub = pb::DraftWorker::NewStub(fresh->draft->Channel());
      fresh->target_stub = pb::TargetWorker::NewStub(fresh->target->Channel());
      fresh->draft_oracle =
          std::make_unique<RowOracle>(OracleEngine(fresh->model, fresh->exit_layer));
      fresh->target_oracle = std::make_unique<RowOracle>(OracleEngine(fresh->model, 0));
      fresh->vocab = fresh->target_oracle->vocab();
      w = std::move(fresh);
    }
    w_ = w.get();
  }

  static std::map<ModelKind, std::unique_ptr<Workers>>& pairs() {
    static auto* p = new std::map<ModelKind, std::unique_ptr<Workers>>();
    return *p;
  }

  pb::InfoResponse Info(bool draft) {
    grpc::ClientContext context;
    pb::InfoResponse info;
    const grpc::Status st = draft ? w_->draft_stub->Info(&context, {}, &info)
                                  : w_->target_stub->Info(&context, {}, &info);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return info;
  }

  pb::TruncateResult Truncate(bool draft, uint64_t seq, int64_t new_len, int32_t query_step = 0,
                              const std::vector<int32_t>& query = {}) {
    grpc::ClientContext context;
    pb::TruncateRequest req;
    pb::TruncateSequence* s = req.add_sequences();
    s->set_seq_id(seq);
    s->set_new_len(new_len);
    s->set_query_step(query_step);
    s->mutable_query_tokens()->Assign(query.begin(), query.end());
    pb::TruncateResponse reply;
    const grpc::Status st = draft ? w_->draft_stub->Truncate(&context, req, &reply)
                                  : w_->target_stub->Truncate(&context, req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(reply.results_size(), 1);
    if (reply.results_size() != 1) return {};
    EXPECT_EQ(reply.results(0).status().code(), 0) << reply.results(0).status().message();
    return reply.results(0);
  }

  std::vector<float> ReadRow(bool draft, uint64_t seq, int32_t step) {
    grpc::ClientContext context;
    pb::ReadRowsRequest req;
    pb::RowQuery* q = req.add_rows();
    q->set_seq_id(seq);
    q->set_step(step);
    pb::ReadRowsResponse reply;
    const grpc::Status st = draft ? w_->draft_stub->ReadRows(&context, req, &reply)
                                  : w_->target_stub->ReadRows(&context, req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(reply.rows_size(), 1);
    if (reply.rows_size() != 1) return {};
    EXPECT_EQ(reply.rows(0).status().code(), 0) << reply.rows(0).status().message();
    return RowFromReply(reply.rows(0), w_->vocab);
  }

  void Release(bool draft, uint64_t seq) {
    grpc::ClientContext context;
    pb::ReleaseRequest req;
    req.set_seq_id(seq);
    pb::ReleaseResponse reply;
    const grpc::Status st = draft ? w_->draft_stub->Release(&context, req, &reply)
                                  : w_->target_stub->Release(&context, req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
  }

  Workers* w_ = nullptr;
};

void ExpectVerifyEquals(const pb::VerifyResult& got, const ExpectedVerify& want) {
  ASSERT_EQ(got.status().code(), 0) << got.status().message();
  EXPECT_EQ(got.position(), want.position);
  EXPECT_TRUE(
      SameBits(std::vector<float>(got.p_draft().begin(), got.p_draft().end()), want.p_draft));
  EXPECT_EQ(std::vector<int32_t>(got.argmax().begin(), got.argmax().end()), want.argmax);
  EXPECT_EQ(got.bonus_token(), want.bonus);
  ASSERT_EQ(static_cast<size_t>(got.candidates_size()), want.candidates.size());
  for (size_t i = 0; i < want.candidates.size(); ++i) {
    const pb::Candidates& c = got.candidates(static_cast<int>(i));
    EXPECT_EQ(std::vector<int32_t>(c.tokens().begin(), c.tokens().end()), want.candidates[i]);
    EXPECT_TRUE(
        SameBits(std::vector<float>(c.p_probs().begin(), c.p_probs().end()), want.candidate_p[i]));
  }
}

void ExpectDraftEquals(const DraftCall& call, uint64_t seq, const ExpectedDraft& want) {
  ASSERT_TRUE(call.tokens.contains(seq)) << "no tokens for sequence " << seq;
  EXPECT_EQ(call.tokens.at(seq), want.tokens) << "sequence " << seq;
  EXPECT_TRUE(SameBits(call.q.at(seq), want.q)) << "sequence " << seq;
}

TEST_P(WorkerServiceTest, InfoDescribesModelKvAndTokenizer) {
  const pb::InfoResponse draft = Info(true);
  const pb::InfoResponse target = Info(false);
  EXPECT_EQ(draft.role(), pb::WORKER_ROLE_DRAFT);
  EXPECT_EQ(target.role(), pb::WORKER_ROLE_TARGET);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::LoadFromDir(w_->model);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(w_->model);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  for (const pb::InfoResponse* info : {&draft, &target}) {
    EXPECT_EQ(info->protocol_version(), kWorkerProtocolVersion);
    EXPECT_EQ(info->vocab_size(), w_->vocab);
    EXPECT_EQ(info->weights_fingerprint(), WeightsFingerprint(**checkpoint));
    EXPECT_EQ(info->model_name(), "model");
    EXPECT_EQ(info->tokenizer_fingerprint(), (*tokenizer)->Fingerprint());
    ASSERT_TRUE(info->tokenizer_files().contains("tokenizer.json"));
    std::ifstream in(w_->model / "tokenizer.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(info->tokenizer_files().at("tokenizer.json"), text);
    EXPECT_EQ(info->kv_block_size(), 16);
    EXPECT_EQ(info->kv_total_blocks(), 4096 / 16);
    EXPECT_EQ(info->max_seq_len(), 512);
    EXPECT_EQ(info->num_threads(), 1);
    EXPECT_EQ(info->max_speculative_tokens(), 64);
    EXPECT_EQ(info->max_candidates(), 64);
    EXPECT_NE(info->epoch(), 0u);
  }
  EXPECT_NE(draft.epoch(), target.epoch());
  const nlohmann::json draft_config =
      nlohmann::json::parse(draft.model_config_json(), nullptr, false);
  ASSERT_FALSE(draft_config.is_discarded());
  EXPECT_EQ(draft_config.value("num_hidden_layers", 0), w_->exit_layer);
}

// Three speculative rounds of one sequence per sampling mode, with the coordinator's moves
// simulated: accept a prefix, ask the draft for q_r(y) of the target's candidates, truncate both
// workers, and read the kept rows back.
TEST_P(WorkerServiceTest, SpeculativeRoundsMatchTheInProcessEngineBitForBit) {
  constexpr int32_t K = 4;
  constexpr int32_t M = 3;
  const uint64_t base = 100;
  for (int mode = 0; mode < 3; ++mode) {
    const SamplingParams params = mode == 0   ? Params(0.9f, 0, 0.95f, 0.0f, 1.1f, 0.2f, 0.1f)
                                  : mode == 1 ? Params(1.0f)
                                              : Params(0.0f);
    const uint64_t seq = base + static_cast<uint64_t>(mode);
    const uint64_t seed = 0xfeed'0000'0000'0000ULL + seq;
    const int64_t prompt_len = 10;
    std::vector<int32_t> x = Prompt(10, mode, w_->vocab);
    int64_t len_d = 0, len_t = 0;
    for (int round = 0; round < 3; ++round) {
      pb::DraftRequest dreq;
      *dreq.add_sequences() = DraftSeq(seq, std::vector<int32_t>(x.begin() + len_d, x.end()), len_d,
                                       K, params, seed, prompt_len);
      const DraftCall draft = CallDraft(*w_->draft_stub, dreq);
      ASSERT_TRUE(draft.status.ok()) << draft.status.error_message();
      ASSERT_EQ(draft.response.steps_size(), K);
      const ExpectedDraft want_d =
          ReferenceDraft(*w_->draft_oracle, x, prompt_len, params, seed, K);
      ExpectDraftEquals(draft, seq, want_d);
      ASSERT_EQ(draft.cache.at(seq).cached_len(), static_cast<int64_t>(x.size()) + K - 1);

      pb::VerifyRequest vreq;
      *vreq.add_sequences() = VerifySeq(seq, std::vector<int32_t>(x.begin() + len_t, x.end()),
                                        len_t, draft.tokens.at(seq), params, seed, prompt_len, M);
      const VerifyCall verify = CallVerify(*w_->target_stub, vreq);
      ASSERT_TRUE(verify.status.ok()) << verify.status.error_message();
      const ExpectedVerify want_v =
          ReferenceVerify(*w_->target_oracle, x, prompt_len, draft.tokens.at(seq), params, seed, M);
      ExpectVerifyEquals(verify.results.at(seq), want_v);
      ASSERT_EQ(verify.results.at(seq).cache().cached_len(), static_cast<int64_t>(x.size()) + K);

      // Accept n drafts (a different n each round); r = n + 1 is the first rejection.
      const int32_t n = (round + mode) % (K + 1);
      int32_t next;
      if (n < K) {
        const std::vector<int32_t> ys =
            params.greedy() ? std::vector<int32_t>{want_v.argmax[n]} : want_v.candidates[n];
        const pb::TruncateResult tr =
            Truncate(true, seq, static_cast<int64_t>(x.size()) + n, n + 1, ys);
        len_d = tr.cache().cached_len();
        std::vector<float> want_q;
        for (const int32_t y : ys) want_q.push_back(want_d.rows[n][static_cast<size_t>(y)]);
        EXPECT_TRUE(SameBits(std::vector<float>(tr.q_probs().begin(), tr.q_probs().end()), want_q));
        next = ys[0];
      } else {
        // t_K was sampled but never fed: the draft holds one token less than the target.
        len_d = Truncate(true, seq, static_cast<int64_t>(x.size()) + n).cache().cached_len();
        EXPECT_EQ(len_d, static_cast<int64_t>(x.size()) + K - 1);
        next = want_v.bonus;
      }
      const pb::TruncateResult tt = Truncate(false, seq, static_cast<int64_t>(x.size()) + n);
      EXPECT_EQ(tt.cache().cached_len(), static_cast<int64_t>(x.size()) + n);
      // The rows stay readable after Truncate (the exact residual fallback).
      const int32_t r = std::min(n + 1, K);
      EXPECT_TRUE(SameBits(ReadRow(true, seq, r), want_d.rows[static_cast<size_t>(r - 1)]));
      EXPECT_TRUE(SameBits(ReadRow(false, seq, n + 1), want_v.rows[static_cast<size_t>(n)]));

      x.insert(x.end(), draft.tokens.at(seq).begin(), draft.tokens.at(seq).begin() + n);
      x.push_back(next);
      len_t = tt.cache().cached_len();
    }
    // K = 0 on the target is plain decoding: one token from TARGET_SAMPLE.
    pb::VerifyRequest plain;
    *plain.add_sequences() = VerifySeq(seq, std::vector<int32_t>(x.begin() + len_t, x.end()), len_t,
                                       {}, params, seed, prompt_len, M);
    const VerifyCall out = CallVerify(*w_->target_stub, plain);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    ExpectVerifyEquals(out.results.at(seq),
                       ReferenceVerify(*w_->target_oracle, x, prompt_len, {}, params, seed, M));
    Release(true, seq);
    Release(false, seq);
  }
}

TEST_P(WorkerServiceTest, SixteenSequencesInOneBatchEqualEachAlone) {
  std::vector<pb::DraftSequence> drafts;
  for (int i = 0; i < 16; ++i) {
    drafts.push_back(DraftSeq(200 + i, Prompt(2 + 9 * i, i, w_->vocab), 0, 1 + (i * 3) % 7,
                              Variety(i), 7000 + i, 1 + i));
  }
  pb::DraftRequest together;
  for (const pb::DraftSequence& d : drafts) *together.add_sequences() = d;
  const DraftCall batched = CallDraft(*w_->draft_stub, together);
  ASSERT_TRUE(batched.status.ok()) << batched.status.error_message();
  EXPECT_EQ(batched.response.steps_size(), 7);  // the longest K

  pb::VerifyRequest vtogether;
  for (const pb::DraftSequence& d : drafts) {
    const std::vector<int32_t> t = batched.tokens.at(d.seq_id());
    ASSERT_EQ(t.size(), static_cast<size_t>(d.num_speculative_tokens()));
    *vtogether.add_sequences() =
        VerifySeq(d.seq_id(), {d.catch_up_tokens().begin(), d.catch_up_tokens().end()}, 0, t,
                  Variety(static_cast<int>(d.seq_id() - 200)), d.seed(), d.prompt_len(), 4);
  }
  const VerifyCall vbatched = CallVerify(*w_->target_stub, vtogether);
  ASSERT_TRUE(vbatched.status.ok()) << vbatched.status.error_message();
  ASSERT_EQ(vbatched.results.size(), 16u);

  for (int i = 0; i < 16; ++i) {
    const pb::DraftSequence& d = drafts[static_cast<size_t>(i)];
    pb::DraftRequest alone;
    *alone.add_sequences() = d;
    alone.mutable_sequences(0)->set_seq_id(d.seq_id() + 1000);
    const DraftCall single = CallDraft(*w_->draft_stub, alone);
    ASSERT_TRUE(single.status.ok());
    EXPECT_EQ(single.tokens.at(d.seq_id() + 1000), batched.tokens.at(d.seq_id())) << i;
    EXPECT_TRUE(SameBits(single.q.at(d.seq_id() + 1000), batched.q.at(d.seq_id()))) << i;
    const std::vector<int32_t> x(d.catch_up_tokens().begin(), d.catch_up_tokens().end());
    ExpectDraftEquals(batched, d.seq_id(),
                      ReferenceDraft(*w_->draft_oracle, x, d.prompt_len(), Variety(i), d.seed(),
                                     d.num_speculative_tokens()));

    pb::VerifyRequest valone;
    *valone.add_sequences() = vtogether.sequences(i);
    valone.mutable_sequences(0)->set_seq_id(d.seq_id() + 1000);
    const VerifyCall vsingle = CallVerify(*w_->target_stub, valone);
    ASSERT_TRUE(vsingle.status.ok());
    const ExpectedVerify want =
        ReferenceVerify(*w_->target_oracle, x, d.prompt_len(), batched.tokens.at(d.seq_id()),
                        Variety(i), d.seed(), 4);
    ExpectVerifyEquals(vbatched.results.at(d.seq_id()), want);
    ExpectVerifyEquals(vsingle.results.at(d.seq_id() + 1000), want);
    for (const uint64_t seq : {d.seq_id(), d.seq_id() + 1000}) {
      Release(true, seq);
      Release(false, seq);
    }
  }
}

TEST_P(WorkerServiceTest, RandomizedSessionReturnsEveryBlock) {
  const int64_t total = Info(true).kv_total_blocks();
  std::mt19937 rng(GetParam() == ModelKind::kSynthetic ? 1 : 2);
  auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  struct Seq {
    std::vector<int32_t> x;
    int64_t len_d = 0, len_t = 0;
  };
  std::map<uint64_t, Seq> live;
  uint64_t next_id = 300;
  for (int round = 0; round < 30; ++round) {
    while (live.size() < 3 || (live.size() < 8 && rand(0, 2) == 0)) {
      live[next_id].x = Prompt(rand(2, 60), static_cast<int>(next_id), w_->vocab);
      ++next_id;
    }
    pb::DraftRequest dreq;
    for (auto& [id, s] : live) {
      *dreq.add_sequences() = DraftSeq(id, std::vector<int32_t>(s.x.begin() + s.len_d, s.x.end()),
                                       s.len_d, rand(1, 6), Variety(rand(0, 7)), id, 1);
    }
    const DraftCall draft = CallDraft(*w_->draft_stub, dreq);
    ASSERT_TRUE(draft.status.ok()) << draft.status.error_message();
    ASSERT_TRUE(draft.failed.empty()) << draft.failed.begin()->second.message();
    pb::VerifyRequest vreq;
    for (auto& [id, s] : live) {
      *vreq.add_sequences() =
          VerifySeq(id, std::vector<int32_t>(s.x.begin() + s.len_t, s.x.end()), s.len_t,
                    draft.tokens.at(id), Variety(rand(0, 7)), id, 1, rand(0, 3));
    }
    const VerifyCall verify = CallVerify(*w_->target_stub, vreq);
    ASSERT_TRUE(verify.status.ok()) << verify.status.error_message();
    for (auto it = live.begin(); it != live.end();) {
      const uint64_t id = it->first;
      Seq& s = it->second;
      const pb::VerifyResult& r = verify.results.at(id);
      ASSERT_EQ(r.status().code(), 0) << r.status().message();
      const std::vector<int32_t>& t = draft.tokens.at(id);
      const int n = rand(0, static_cast<int>(t.size()));
      const int64_t old_len = static_cast<int64_t>(s.x.size());
      s.x.insert(s.x.end(), t.begin(), t.begin() + n);
      s.x.push_back(n == static_cast<int>(t.size()) ? r.bonus_token() : r.argmax(n));
      s.len_d = Truncate(true, id, old_len + n).cache().cached_len();
      s.len_t = Truncate(false, id, old_len + n).cache().cached_len();
      if (s.x.size() > 200 || rand(0, 5) == 0) {
        Release(true, id);
        Release(false, id);
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [id, s] : live) {
    Release(true, id);
    Release(false, id);
  }
  EXPECT_EQ(Info(true).kv_free_blocks(), total);
  EXPECT_EQ(Info(false).kv_free_blocks(), total);
  for (ChildProcess* p : {w_->draft.get(), w_->target.get()}) {
    absl::StatusOr<std::string> metrics = HttpGet(p->metrics_port(), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_THAT(*metrics, HasSubstr("specd_worker_kv_blocks_used 0"));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, WorkerServiceTest,
                         ::testing::Values(ModelKind::kSynthetic, ModelKind::kStories260K),
                         [](const ::testing::TestParamInfo<ModelKind>& info) {
                           return ModelKindName(info.param);
                         });

}  // namespace
}  // namespace specd::testing
