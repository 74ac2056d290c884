// The worker processes as operators and the coordinator see them: precise gRPC status codes and
// messages for every error, per-sequence failures that leave the rest of the batch alone,
// health, reflection, /metrics, SIGTERM draining, cancellation, and flag errors.
#include "tests/services/worker_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "tests/common/worker/worker_reference.h"
#include "tests/memory_cgroup.h"
#include "tests/services/worker_fixture.h"
#include "tests/test_util.h"

namespace specd::testing {
namespace {

using ::testing::HasSubstr;

SamplingParams Sampled() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 30;
  return p;
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 29 + salt * 13 + 4) % 500 + 3);
  return t;
}

class WorkerProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new ScopedTempDir();
    const absl::Status st = PrepareModel(ModelKind::kSynthetic, model());
    ASSERT_TRUE(st.ok()) << st;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::filesystem::path model() { return tmp_->path() / "model"; }

  // A worker of its own, so every test starts from an empty KV pool.
  static std::unique_ptr<ChildProcess> Start(bool draft,
                                             const std::vector<std::string>& extra = {}) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(
        draft ? DraftWorkerBinary() : TargetWorkerBinary(), WorkerArgs(model(), extra));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  static ScopedTempDir* tmp_;
};

ScopedTempDir* WorkerProcessTest::tmp_ = nullptr;

TEST_F(WorkerProcessTest, WholeCallErrorsAreTheRpcStatus) {
  auto draft = Start(true);
  auto target = Start(false);
  ASSERT_TRUE(draft && target);
  auto ds = pb::DraftWorker::NewStub(draft->Channel());
  auto ts = pb::TargetWorker::NewStub(target->Channel());

  DraftCall empty = CallDraft(*ds, pb::DraftRequest());
  EXPECT_EQ(empty.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(empty.status.error_message(), "Draft: the request has no sequences");
  EXPECT_EQ(empty.response.steps_size(), 0);

  pb::DraftRequest dup;
  *dup.add_sequences() = DraftSeq(5, {1}, 0, 2, Sampled(), 1, 1);
  *dup.add_sequences() = DraftSeq(5, {1}, 0, 2, Sampled(), 1, 1);
  EXPECT_EQ(CallDraft(*ds, dup).status.error_message(),
            "Draft: seq_id 5 appears more than once in the request");

  pb::DraftRequest big_k;
  *big_k.add_sequences() = DraftSeq(6, {1}, 0, 65, Sampled(), 1, 1);
  const DraftCall k_call = CallDraft(*ds, big_k);
  EXPECT_EQ(k_call.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(k_call.status.error_message(),
            "Draft: seq_id 6 asks for num_speculative_tokens 65, at most 64 are allowed");

  pb::DraftRequest bad_mode;
  *bad_mode.add_sequences() = DraftSeq(8, {1}, 0, 2, Sampled(), 1, 1);
  bad_mode.mutable_sequences(0)->set_draft_sampling(static_cast<pb::DraftSampling>(99));
  const DraftCall mode_call = CallDraft(*ds, bad_mode);
  EXPECT_EQ(mode_call.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(mode_call.status.error_message(),
            "Draft: seq_id 8 has draft_sampling 99, which is not a DraftSampling value");

  EXPECT_EQ(CallVerify(*ts, pb::VerifyRequest()).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  pb::VerifyRequest big_m;
  *big_m.add_sequences() = VerifySeq(7, {1}, 0, {2}, Sampled(), 1, 1, 65);
  const VerifyCall m_call = CallVerify(*ts, big_m);
  EXPECT_EQ(m_call.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(m_call.status.error_message(),
            "Verify: seq_id 7 asks for num_candidates 65, at most 64 are allowed");
  pb::VerifyRequest many_drafts;
  *many_drafts.add_sequences() =
      VerifySeq(8, {1}, 0, std::vector<int32_t>(65, 3), Sampled(), 1, 1, 1);
  EXPECT_EQ(CallVerify(*ts, many_drafts).status.error_message(),
            "Verify: seq_id 8 has 65 draft_tokens, at most 64 are allowed");
  // Nothing was created by the rejected calls.
  grpc::ClientContext context;
  pb::InfoResponse info;
  ASSERT_TRUE(ts->Info(&context, {}, &info).ok());
  EXPECT_EQ(info.kv_free_blocks(), info.kv_total_blocks());
}

// A caller that expects another process (it missed a restart) is refused before anything is
// created, with UNAVAILABLE, so that it reads Info again; the right epoch, or none, is served.
TEST_F(WorkerProcessTest, CallsMeantForAnotherProcessAreRefusedUntouched) {
  auto draft = Start(true);
  auto target = Start(false);
  ASSERT_TRUE(draft && target);
  auto ds = pb::DraftWorker::NewStub(draft->Channel());
  auto ts = pb::TargetWorker::NewStub(target->Channel());
  pb::InfoResponse draft_info, target_info;
  {
    grpc::ClientContext c1, c2;
    ASSERT_TRUE(ds->Info(&c1, {}, &draft_info).ok());
    ASSERT_TRUE(ts->Info(&c2, {}, &target_info).ok());
  }
  ASSERT_NE(target_info.epoch(), 0u);
  ASSERT_FALSE(target_info.tokenizer_files().empty());
  {
    // What the coordinator's probes ask for: the same Info without the tokenizer files.
    grpc::ClientContext ctx;
    pb::InfoRequest lite;
    lite.set_omit_tokenizer_files(true);
    pb::InfoResponse probe;
    ASSERT_TRUE(ts->Info(&ctx, lite, &probe).ok());
    EXPECT_TRUE(probe.tokenizer_files().empty());
    pb::InfoResponse expected = target_info;
    expected.clear_tokenizer_files();
    EXPECT_EQ(probe.SerializeAsString(), expected.SerializeAsString());
  }
  const uint64_t stale = target_info.epoch() ^ 0x5a5a;

  pb::VerifyRequest verify;
  *verify.add_sequences() = VerifySeq(1, Tokens(6, 1), 0, {}, Sampled(), 1, 6, 0);
  verify.set_expected_epoch(stale);
  const VerifyCall refused = CallVerify(*ts, verify);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.status.error_message(),
            absl::StrCat("this worker process (epoch ", target_info.epoch(),
                         ") started after the caller last read its Info (epoch ", stale,
                         "): read Info again before sending sequences here"));
  pb::DraftRequest draft_req;
  *draft_req.add_sequences() = DraftSeq(1, Tokens(6, 1), 0, 2, Sampled(), 1, 6);
  draft_req.set_expected_epoch(draft_info.epoch() + 1);
  EXPECT_EQ(CallDraft(*ds, draft_req).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  {
    grpc::ClientContext c1, c2;
    pb::InfoResponse d, t;
    ASSERT_TRUE(ds->Info(&c1, {}, &d).ok());
    ASSERT_TRUE(ts->Info(&c2, {}, &t).ok());
    EXPECT_EQ(d.kv_free_blocks(), d.kv_total_blocks()) << "the refused Draft created nothing";
    EXPECT_EQ(t.kv_free_blocks(), t.kv_total_blocks()) << "the refused Verify created nothing";
  }

  verify.set_expected_epoch(target_info.epoch());
  const VerifyCall served = CallVerify(*ts, verify);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.results.at(1).status().code(), 0);
  draft_req.set_expected_epoch(0);
  EXPECT_TRUE(CallDraft(*ds, draft_req).status.ok());
}

TEST_F(WorkerProcessTest, PerSequenceErrorsLeaveTheBatchAlone) {
  // 4 blocks of 16 tokens, sequences of at most 40 tokens.
  auto target = Start(false, {"--kv-tokens", "64", "--max-seq-len", "40"});
  ASSERT_TRUE(target);
  auto ts = pb::TargetWorker::NewStub(target->Channel());
  pb::VerifyRequest setup;
  *setup.add_sequences() = VerifySeq(1, Tokens(10, 1), 0, {}, Sampled(), 1, 10, 0);
  ASSERT_EQ(CallVerify(*ts, setup).results.at(1).status().code(), 0);

  pb::VerifyRequest req;
  *req.add_sequences() = VerifySeq(2, Tokens(5, 2), 0, {7, 8}, Sampled(), 9, 5, 3);  // fine
  *req.add_sequences() = VerifySeq(3, {4}, 6, {}, Sampled(), 1, 0, 0);               // unknown
  *req.add_sequences() = VerifySeq(1, {4}, 3, {}, Sampled(), 1, 0, 0);               // holds 10
  *req.add_sequences() = VerifySeq(4, {4, 512}, 0, {}, Sampled(), 1, 0, 0);          // vocab is 512
  *req.add_sequences() = VerifySeq(5, Tokens(38, 5), 0, {1, 2, 3}, Sampled(), 1, 0, 0);  // 41
  *req.add_sequences() = VerifySeq(6, Tokens(35, 6), 0, {}, Sampled(), 1, 0, 0);         // 3 blocks
  for (const auto& [token, bias] : {std::pair{3, 1.0f}, std::pair{512, -100.0f}}) {
    pb::TokenBias* b = req.mutable_sequences(0)->mutable_sampling()->add_logit_bias();
    b->set_token(token);
    b->set_bias(bias);
  }
  *req.add_sequences() = req.sequences(0);  // seq 2 with a bias past the vocabulary
  req.mutable_sequences(6)->set_seq_id(7);
  req.mutable_sequences(0)->mutable_sampling()->clear_logit_bias();
  const VerifyCall call = CallVerify(*ts, req);
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  const std::map<uint64_t, std::pair<int, std::string>> want = {
      {3, {5, "unknown sequence 3 (expected 6 cached tokens; the worker may have restarted"}},
      {1, {9, "sequence 1: coordinator expects 3 cached tokens, worker holds 10"}},
      {4, {3, "sequence 4: token id 512 at catch-up index 1 is outside [0, 512)"}},
      {5, {11, "sequence 5 would reach 41 tokens, over max_seq_len 40"}},
      {6, {8, "sequence 6 needs 3 more KV blocks for 35 tokens but only 2 are free"}},
      {7, {3, "sequence 7: logit_bias token 512 is outside the vocabulary [0, 512)"}},
  };
  for (const auto& [seq, code_message] : want) {
    const pb::VerifyResult& r = call.results.at(seq);
    EXPECT_EQ(r.status().code(), code_message.first) << seq << ": " << r.status().message();
    EXPECT_THAT(r.status().message(), HasSubstr(code_message.second));
  }
  EXPECT_EQ(call.results.at(1).cache().cached_len(), 10);
  // The good sequence is exactly what it would be alone.
  EngineOptions options;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(model(), 1, options);
  ASSERT_TRUE(engine.ok());
  RowOracle oracle(*std::move(engine));
  const ExpectedVerify expected = ReferenceVerify(oracle, Tokens(5, 2), 5, {7, 8}, Sampled(), 9, 3);
  const pb::VerifyResult& good = call.results.at(2);
  ASSERT_EQ(good.status().code(), 0) << good.status().message();
  EXPECT_EQ(good.bonus_token(), expected.bonus);
  EXPECT_TRUE(
      SameBits(std::vector<float>(good.p_draft().begin(), good.p_draft().end()), expected.p_draft));
  EXPECT_EQ(good.cache().cached_len(), 7);
  EXPECT_EQ(good.cache().free_kv_blocks(), 2);
  EXPECT_EQ(good.cache().free_kv_tokens(), 32);
  // One result per sequence, in request order.
  EXPECT_EQ(call.order, (std::vector<uint64_t>{2, 3, 1, 4, 5, 6, 7}));
}

TEST_F(WorkerProcessTest, DraftReportsEachFailureOnceAndDraftsTheRest) {
  auto draft = Start(true, {"--exit-layer", "2"});
  ASSERT_TRUE(draft);
  auto ds = pb::DraftWorker::NewStub(draft->Channel());
  pb::DraftRequest req;
  *req.add_sequences() = DraftSeq(1, Tokens(6, 1), 0, 3, Sampled(), 5, 6);
  *req.add_sequences() = DraftSeq(2, {4}, 9, 3, Sampled(), 5, 0);  // unknown
  *req.add_sequences() = DraftSeq(3, {-1}, 0, 3, Sampled(), 5, 0);
  *req.add_sequences() = DraftSeq(4, {4}, 0, 0, Sampled(), 5, 0);  // K = 0
  const DraftCall call = CallDraft(*ds, req);
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  ASSERT_EQ(call.response.steps_size(), 3);
  EXPECT_EQ(call.response.steps(0).tokens_size(), 4);  // t_1 of sequence 1 and the three failures
  EXPECT_EQ(call.failed.at(2).code(), 5);
  EXPECT_EQ(call.failed.at(3).code(), 3);
  EXPECT_THAT(call.failed.at(3).message(), HasSubstr("token id -1 at catch-up index 0"));
  EXPECT_THAT(call.failed.at(4).message(),
              HasSubstr("num_speculative_tokens must be in [1, 64], got 0"));
  EXPECT_EQ(call.tokens.at(1).size(), 3u);
  EXPECT_EQ(call.response.cache_size(), 4);
  EXPECT_EQ(call.cache.at(1).cached_len(), 8);
  EXPECT_EQ(call.cache.at(2).cached_len(), 0);

  // Unary errors.
  auto unary = [&](auto method, auto request, auto* reply) {
    grpc::ClientContext context;
    return ((*ds).*method)(&context, request, reply);
  };
  // Truncate and ReadRows answer per sequence; only an empty or repeated batch fails the call.
  pb::TruncateRequest tr;
  pb::TruncateResponse tr_reply;
  grpc::Status st = unary(&pb::DraftWorker::Stub::Truncate, tr, &tr_reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "Truncate: the request has no sequences");
  pb::TruncateSequence* unknown = tr.add_sequences();
  unknown->set_seq_id(77);
  pb::TruncateSequence* negative = tr.add_sequences();
  negative->set_seq_id(1);
  negative->set_new_len(-2);
  ASSERT_TRUE(unary(&pb::DraftWorker::Stub::Truncate, tr, &tr_reply).ok());
  ASSERT_EQ(tr_reply.results_size(), 2);
  EXPECT_EQ(tr_reply.results(0).seq_id(), 77u);
  EXPECT_EQ(tr_reply.results(0).status().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(tr_reply.results(0).status().message(), "unknown sequence 77");
  EXPECT_EQ(tr_reply.results(1).status().code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  pb::TruncateRequest repeated;
  *repeated.add_sequences() = *negative;
  *repeated.add_sequences() = *negative;
  st = unary(&pb::DraftWorker::Stub::Truncate, repeated, &tr_reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "Truncate: seq_id 1 appears more than once in the request");
  pb::TruncateRequest query;
  pb::TruncateSequence* q = query.add_sequences();
  q->set_seq_id(1);
  q->set_new_len(7);
  q->set_query_step(4);
  q->add_query_tokens(3);
  ASSERT_TRUE(unary(&pb::DraftWorker::Stub::Truncate, query, &tr_reply).ok());
  ASSERT_EQ(tr_reply.results_size(), 1);
  EXPECT_EQ(tr_reply.results(0).status().code(),
            static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_EQ(
      tr_reply.results(0).status().message(),
      "sequence 1: no kept row for query_step 4 (3 rows are kept from the last Draft/Verify)");
  pb::ReadRowsRequest rr;
  pb::ReadRowsResponse rr_reply;
  EXPECT_EQ(unary(&pb::DraftWorker::Stub::ReadRows, rr, &rr_reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  pb::RowQuery* row0 = rr.add_rows();
  row0->set_seq_id(1);
  row0->set_step(0);
  pb::RowQuery* row3 = rr.add_rows();
  row3->set_seq_id(1);
  row3->set_step(3);
  ASSERT_TRUE(unary(&pb::DraftWorker::Stub::ReadRows, rr, &rr_reply).ok());
  ASSERT_EQ(rr_reply.rows_size(), 2);
  EXPECT_EQ(rr_reply.rows(0).status().code(),
            static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_EQ(rr_reply.rows(1).status().code(), 0);
  EXPECT_FALSE(rr_reply.rows(1).dense());  // top-k 30 of 512: sparse
  EXPECT_EQ(rr_reply.rows(1).ids_size(), 30);
  EXPECT_EQ(rr_reply.rows(1).cache().cached_len(), 8);
  pb::ReleaseRequest rel;
  rel.set_seq_id(99);
  pb::ReleaseResponse rel_reply;
  st = unary(&pb::DraftWorker::Stub::Release, rel, &rel_reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(st.error_message(), "unknown sequence 99");
  // Rejected sequences were never created; the drafted one gives back all its blocks.
  rel.set_seq_id(2);
  EXPECT_EQ(unary(&pb::DraftWorker::Stub::Release, rel, &rel_reply).error_code(),
            grpc::StatusCode::NOT_FOUND);
  rel.set_seq_id(1);
  ASSERT_TRUE(unary(&pb::DraftWorker::Stub::Release, rel, &rel_reply).ok());
  EXPECT_EQ(rel_reply.free_kv_blocks(), 4096 / 16);
  EXPECT_EQ(rel_reply.cache().cached_len(), 0);
}

TEST_F(WorkerProcessTest, HealthReflectionAndMetrics) {
  auto draft = Start(true);
  ASSERT_TRUE(draft);
  auto health = grpc::health::v1::Health::NewStub(draft->Channel());
  for (const std::string service : {"", "specd.worker.v1.DraftWorker"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse reply;
    ASSERT_TRUE(health->Check(&context, req, &reply).ok()) << "service '" << service << "'";
    EXPECT_EQ(reply.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }

  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(draft->Channel());
  grpc::ClientContext context;
  auto stream = reflection->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  grpc::reflection::v1alpha::ServerReflectionRequest file;
  file.set_file_containing_symbol("specd.worker.v1.DraftWorker");
  ASSERT_TRUE(stream->Write(file));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse reply;
  ASSERT_TRUE(stream->Read(&reply));
  std::vector<std::string> services;
  for (const auto& s : reply.list_services_response().service()) services.push_back(s.name());
  EXPECT_THAT(services,
              ::testing::IsSupersetOf({"specd.worker.v1.DraftWorker", "grpc.health.v1.Health",
                                       "grpc.reflection.v1alpha.ServerReflection"}));
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_EQ(reply.file_descriptor_response().file_descriptor_proto_size(), 1);
  EXPECT_THAT(reply.file_descriptor_response().file_descriptor_proto(0),
              HasSubstr("specd/worker/v1/worker.proto"));
  EXPECT_TRUE(stream->Finish().ok());

  auto ds = pb::DraftWorker::NewStub(draft->Channel());
  pb::DraftRequest req;
  *req.add_sequences() = DraftSeq(1, Tokens(20, 1), 0, 3, Sampled(), 5, 20);
  ASSERT_TRUE(CallDraft(*ds, req).status.ok());
  absl::StatusOr<std::string> metrics = HttpGet(draft->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (const char* name : {"specd_worker_kv_blocks_used 2", "specd_worker_kv_blocks_free 254",
                           "specd_worker_forward_duration_seconds_count{kind=\"draft_step\"} 3",
                           "specd_worker_forward_duration_seconds_bucket{kind=\"verify\"",
                           "specd_worker_batch_size_count{kind=\"draft_step\"} 3",
                           "specd_worker_tokens_processed_total{kind=\"draft_step\"} 22",
                           "specd_worker_tokens_processed_total{kind=\"catch_up\"} 0"}) {
    EXPECT_THAT(*metrics, HasSubstr(name));
  }
}

TEST_F(WorkerProcessTest, SigtermDrainsInFlightCallsAndExitsZero) {
  auto draft = Start(true);
  ASSERT_TRUE(draft);
  auto ds = pb::DraftWorker::NewStub(draft->Channel());
  pb::DraftRequest req;
  for (int i = 0; i < 16; ++i) {
    *req.add_sequences() = DraftSeq(10 + i, Tokens(100, i), 0, 64, Sampled(), i, 100);
  }
  bool signalled = false;
  const DraftCall call = CallDraft(*ds, req, [&](grpc::ClientContext&) {
    // Signalled before the worker took the call, the drain would refuse it: wait for its first
    // forward pass (the catch-up rides in the first draft step), as /metrics counts it.
    const auto processed = [&] {
      return MetricValue(draft->metrics_port(),
                         "specd_worker_tokens_processed_total{kind=\"draft_step\"}") > 0;
    };
    for (int i = 0; i < 1000 && !processed(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    draft->Signal(SIGTERM);
    signalled = true;
  });
  ASSERT_TRUE(signalled);
  // The call was in flight when SIGTERM came (or already done), so it completes in full.
  EXPECT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.response.steps_size(), 64);
  EXPECT_EQ(draft->Terminate(), 0) << draft->StderrText();
  EXPECT_THAT(draft->StderrText(), HasSubstr("SIGTERM: draining"));
}

TEST_F(WorkerProcessTest, CancelledDraftKeepsTheCacheConsistent) {
  auto draft = Start(true, {"--metrics-port", "-1"});
  ASSERT_TRUE(draft);
  auto ds = pb::DraftWorker::NewStub(draft->Channel());
  pb::DraftRequest req;
  for (int i = 0; i < 16; ++i) {
    *req.add_sequences() = DraftSeq(10 + i, Tokens(200, i), 0, 64, Sampled(), i, 100);
  }
  const DraftCall call =
      CallDraft(*ds, req, [](grpc::ClientContext& context) { context.TryCancel(); });
  // Usually CANCELLED; OK when the whole reply was already on its way.
  EXPECT_TRUE(call.status.error_code() == grpc::StatusCode::CANCELLED || call.status.ok())
      << call.status.error_message();
  // The worker still serves, and each sequence is either complete or absent.
  for (int i = 0; i < 16; ++i) {
    grpc::ClientContext context;
    pb::TruncateRequest tr;
    pb::TruncateSequence* t = tr.add_sequences();
    t->set_seq_id(10 + i);
    t->set_new_len(1000);
    pb::TruncateResponse reply;
    ASSERT_TRUE(ds->Truncate(&context, tr, &reply).ok());
    ASSERT_EQ(reply.results_size(), 1);
    const pb::TruncateResult& result = reply.results(0);
    if (result.status().code() == 0) {
      EXPECT_EQ(result.cache().cached_len(), 200 + 63);
      grpc::ClientContext rc;
      pb::ReleaseRequest rel;
      rel.set_seq_id(10 + i);
      pb::ReleaseResponse rel_reply;
      EXPECT_TRUE(ds->Release(&rc, rel, &rel_reply).ok());
    } else {
      EXPECT_EQ(result.status().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
    }
  }
  grpc::ClientContext context;
  pb::InfoResponse info;
  ASSERT_TRUE(ds->Info(&context, {}, &info).ok());
  EXPECT_EQ(info.kv_free_blocks(), info.kv_total_blocks());
  // Nothing is left hanging: the drain completes at once (and leak-free under ASan).
  EXPECT_EQ(draft->Terminate(), 0) << draft->StderrText();
}

TEST_F(WorkerProcessTest, BadFlagsAndModelsFailClearly) {
  std::string err;
  absl::StatusOr<int> code = ChildProcess::Run(
      DraftWorkerBinary(), {"--model", model().string(), "--kv-tokens", "lots"}, &err);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(err, HasSubstr("--kv-tokens must be an integer, got 'lots'"));

  code =
      ChildProcess::Run(TargetWorkerBinary(), {"--model", model().string(), "--colour", "1"}, &err);
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(err, HasSubstr("unknown flag --colour"));

  code = ChildProcess::Run(TargetWorkerBinary(), {"--listen", "127.0.0.1:0"}, &err);
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(err, HasSubstr("--model is required"));

  code =
      ChildProcess::Run(TargetWorkerBinary(), {"--model", (tmp_->path() / "nope").string()}, &err);
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(err, HasSubstr("nope"));

  code = ChildProcess::Run(
      DraftWorkerBinary(),
      {"--model", model().string(), "--exit-layer", "9", "--metrics-port", "-1"}, &err);
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(err, HasSubstr("exit_layer (9)"));

  code = ChildProcess::Run(
      TargetWorkerBinary(),
      {"--model", model().string(), "--kv-dtype", "f8", "--metrics-port", "-1"}, &err);
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(err, HasSubstr("--kv-dtype must be f32, bf16 or f16, got 'f8'"));

  // A pass budget under a lone sequence's largest round could never be kept.
  code = ChildProcess::Run(
      TargetWorkerBinary(),
      {"--model", model().string(), "--max-pass-tokens", "100", "--metrics-port", "-1"}, &err);
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(err, HasSubstr("--max-pass-tokens must be in [256, "));

  code = ChildProcess::Run(
      TargetWorkerBinary(),
      {"--model", model().string(), "--backend", "tpu", "--metrics-port", "-1"}, &err);
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(err, HasSubstr("unknown back end \"tpu\"; expected cpu, cuda or auto"));

  if (!kernels::CreateBackend({.kind = kernels::BackendKind::kCuda}).ok()) {
    // Asking for a GPU where there is none is a start-up error, never a silent CPU fallback.
    code = ChildProcess::Run(
        TargetWorkerBinary(),
        {"--model", model().string(), "--backend", "cuda", "--metrics-port", "-1"}, &err);
    EXPECT_EQ(*code, 1);
    EXPECT_THAT(err, HasSubstr("--backend cuda"));
  }

  code = ChildProcess::Run(DraftWorkerBinary(), {"--help"}, &err);
  EXPECT_EQ(*code, 0);
}

// A KV cache over the memory limit of the worker's container fails at start with the bytes, the
// limit and the flag that sized it, where it used to be killed by the OOM killer with no word.
// The worker starts in a cgroup of 256 MiB through a shell that joins it first.
TEST_F(WorkerProcessTest, AKvCacheOverTheMemoryLimitFailsAtStartNamingIt) {
  absl::StatusOr<std::unique_ptr<ScopedMemoryCgroup>> cgroup =
      ScopedMemoryCgroup::Create(int64_t{256} << 20);
  if (!cgroup.ok()) GTEST_SKIP() << cgroup.status().message();
  // At least 128 bytes a token in each of K and V: 4M tokens are over 256 MiB, under 256 GiB.
  std::string err;
  absl::StatusOr<int> code = ChildProcess::Run(
      "/bin/sh",
      {"-c", "echo $$ > \"$0\" && exec \"$@\"", (*cgroup)->procs().string(), TargetWorkerBinary(),
       "--model", model().string(), "--kv-tokens", "4000000", "--metrics-port", "-1"},
      &err);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1) << err;
  EXPECT_THAT(err, HasSubstr("K cache of 4000000 tokens (set by --kv-tokens)"));
  EXPECT_THAT(err,
              HasSubstr("MiB more memory can be committed: the memory cgroup limit of 256 MiB"));
}

// --kv-dtype sets what Info, the load log and /metrics report, and the KV memory it takes; the
// expected sizes come from the model's config.json, not from the engine. --max-pass-tokens is
// reported too, for the coordinator's pass budget.
TEST_F(WorkerProcessTest, KvDtypeAndBackendAreReported) {
  for (const auto& [dtype, element_bytes] :
       std::vector<std::pair<std::string, int64_t>>{{"f32", 4}, {"bf16", 2}, {"f16", 2}}) {
    SCOPED_TRACE(dtype);
    auto target =
        Start(false, {"--kv-dtype", dtype, "--kv-tokens", "512", "--max-pass-tokens", "384"});
    ASSERT_TRUE(target);
    pb::InfoResponse info;
    {  // the channel closes with the stub, before Terminate()
      auto ts = pb::TargetWorker::NewStub(target->Channel());
      grpc::ClientContext context;
      ASSERT_TRUE(ts->Info(&context, {}, &info).ok());
    }
    EXPECT_EQ(info.kv_dtype(), dtype);
    EXPECT_EQ(info.max_pass_tokens(), 384);
    EXPECT_THAT(target->StderrText(), HasSubstr("max pass 384 tokens"));
    EXPECT_THAT(info.backend(), ::testing::StartsWith("cpu"));
    const nlohmann::json config = nlohmann::json::parse(info.model_config_json());
    const int64_t head_dim =
        config.contains("head_dim")
            ? config["head_dim"].get<int64_t>()
            : config["hidden_size"].get<int64_t>() / config["num_attention_heads"].get<int64_t>();
    const int64_t kv_dim = head_dim * config["num_key_value_heads"].get<int64_t>();
    const int64_t per_token =
        2 * config["num_hidden_layers"].get<int64_t>() * kv_dim * element_bytes;
    EXPECT_EQ(info.kv_bytes_per_token(), per_token);
    EXPECT_THAT(target->StderrText(), HasSubstr(dtype + " KV"));

    absl::StatusOr<std::string> metrics = HttpGet(target->metrics_port(), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_THAT(*metrics, HasSubstr("kv_dtype=\"" + dtype + "\"} 1"));
    const int64_t kv_bytes = 512 * per_token;
    EXPECT_THAT(*metrics, HasSubstr("specd_worker_memory_bytes{kind=\"kv_cache\"} " +
                                    std::to_string(kv_bytes)));
    EXPECT_THAT(*metrics, HasSubstr("specd_worker_kv_free_bytes " + std::to_string(kv_bytes)));
    EXPECT_EQ(target->Terminate(), 0);
  }
}

// A worker on IPv6 serves gRPC there and /metrics on IPv4 loopback (civetweb, under
// prometheus-cpp, has no IPv6 in Debian's build); it used to fail at start.
TEST_F(WorkerProcessTest, AnIpv6WorkerServesMetricsOnLoopback) {
  const int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 loopback{};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  const bool has_ipv6 =
      probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0;
  if (probe >= 0) close(probe);
  if (!has_ipv6) GTEST_SKIP() << "this machine has no IPv6 loopback to listen on";
  auto target = Start(false, {"--listen", "[::1]:0"});
  ASSERT_TRUE(target);
  EXPECT_THAT(target->startup_lines(),
              ::testing::Contains(::testing::StartsWith("metrics on 127.0.0.1:")));
  EXPECT_THAT(target->startup_lines(),
              ::testing::Contains(absl::StrCat("listening on [::1]:", target->port())));
  EXPECT_GT(MetricValue(target->metrics_port(), "specd_worker_kv_blocks_used"), -1);
  pb::InfoResponse info;
  {  // the channel closes with the stub, before Terminate()
    auto ts = pb::TargetWorker::NewStub(grpc::CreateChannel(absl::StrCat("[::1]:", target->port()),
                                                            grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    ASSERT_TRUE(ts->Info(&context, {}, &info).ok());
  }
  EXPECT_EQ(info.role(), pb::WORKER_ROLE_TARGET);
  EXPECT_EQ(target->Terminate(), 0);
}

// gRPC would share a taken port with SO_REUSEPORT: a second service started there by mistake, or
// one that `specd serve` restarts on an address another program took meanwhile, would answer a
// share of the first one's clients. Each service refuses to start instead.
TEST_F(WorkerProcessTest, AServiceOnATakenPortRefusesToStartAndTheFirstKeepsEveryClient) {
  auto target = Start(false, {"--metrics-port", "-1"});
  ASSERT_TRUE(target);
  const std::string taken = target->address();
  const std::string refusal =
      absl::StrCat("--listen: cannot listen on ", taken, " (is another program listening there?)");
  const absl::StatusOr<std::unique_ptr<ChildProcess>> second = ChildProcess::Start(
      DraftWorkerBinary(), WorkerArgs(model(), {"--listen", taken, "--metrics-port", "-1"}));
  ASSERT_FALSE(second.ok()) << "a second worker started on " << taken;
  EXPECT_THAT(second.status().message(), HasSubstr(refusal));
  const absl::StatusOr<std::unique_ptr<ChildProcess>> coordinator =
      ChildProcess::Start(BuiltBinary("services/coordinator/specd-coordinator"),
                          {"--listen", taken, "--target", taken, "--metrics-port", "-1"});
  ASSERT_FALSE(coordinator.ok()) << "a coordinator started on " << taken;
  EXPECT_THAT(coordinator.status().message(), HasSubstr(refusal));
  // Each new connection (no shared subchannel) reaches the first worker.
  for (int i = 0; i < 8; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = pb::TargetWorker::NewStub(
        grpc::CreateCustomChannel(taken, grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    pb::InfoResponse info;
    ASSERT_TRUE(stub->Info(&context, {}, &info).ok()) << "connection " << i;
    EXPECT_EQ(info.role(), pb::WORKER_ROLE_TARGET) << "connection " << i;
  }
  EXPECT_EQ(target->Terminate(), 0);
}

TEST_F(WorkerProcessTest, MetricsCanBeTurnedOff) {
  auto target = Start(false, {"--metrics-port", "-1"});
  ASSERT_TRUE(target);
  EXPECT_EQ(target->metrics_port(), 0);
  EXPECT_EQ(target->Terminate(), 0);
}

}  // namespace
}  // namespace specd::testing
