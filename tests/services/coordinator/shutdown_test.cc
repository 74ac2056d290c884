// Graceful shutdown (issue 9) over real processes: on SIGTERM the coordinator turns NOT_SERVING
// and refuses new requests with UNAVAILABLE, lets the streams in flight finish within
// --drain-seconds, then ends the rest with an UNAVAILABLE that says why, and exits 0. Workers
// signalled at the same moment (as an orchestrator or `specd serve` does) keep serving the
// sequences they hold until the coordinator has released them.
#include <chrono>
#include <csignal>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "specd/v1/generation.grpc.pb.h"
#include "specd/worker/v1/worker.grpc.pb.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ScopedTempDir;

// Far more than any drain period here lets it generate: the stream that is still running when
// the drain period ends. `tiny` with a long context makes each token cost more as it goes.
constexpr uint32_t kLongTokens = 60000;
constexpr uint32_t kShortTokens = 24;
constexpr int kShortStreams = 4;

v1::GenerateRequest Request(int32_t token, uint32_t max_new) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  r.mutable_token_ids()->add_ids(token);
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_speculation()->set_num_speculative_tokens(2);
  return r;
}

// A stream opened and read up to its first message, so it is in flight on the server.
struct OpenStream {
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  int64_t tokens = 0;
  v1::GenerateResponse last;

  static std::unique_ptr<OpenStream> Start(v1::Generation::Stub& stub,
                                           const v1::GenerateRequest& request) {
    auto s = std::make_unique<OpenStream>();
    s->context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    s->reader = stub.Generate(s->context.get(), request);
    if (!s->reader->Read(&s->last)) return nullptr;
    s->tokens = s->last.token_ids_size();
    return s;
  }

  grpc::Status Finish() {
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      tokens += msg.token_ids_size();
      last = msg;
    }
    return reader->Finish();
  }
};

// Sends SIGTERM (harmless once the drain is over: the signal stays blocked) and waits for the
// exit code, for at most `limit`: a drain that hangs fails the test instead of blocking it.
int ExitCodeWithin(ChildProcess& process, std::chrono::seconds limit) {
  std::future<int> code = std::async(std::launch::async, [&] { return process.Terminate(); });
  if (code.wait_for(limit) == std::future_status::timeout) {
    ADD_FAILURE() << "still running " << limit.count() << " s after its drain:\n"
                  << process.StderrText();
    process.Signal(SIGKILL);
  }
  return code.get();
}

bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 600; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return done();
}

class GracefulShutdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthSpec spec;
    absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
    ASSERT_TRUE(c.ok());
    spec.config = *c;
    spec.config.max_position_embeddings = 65536;
    spec.residual_scale = 0.1;
    ASSERT_TRUE(WriteSyntheticModel(spec, tmp_.path() / "model").ok());
  }

  // Target, early-exit draft and coordinator, the coordinator with `drain_seconds`.
  void StartService(int drain_seconds) {
    const std::vector<std::string> kv = {"--kv-tokens", "32768"};
    auto target = ChildProcess::Start(testing::TargetWorkerBinary(),
                                      testing::WorkerArgs(tmp_.path() / "model", kv));
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    std::vector<std::string> dargs = kv;
    dargs.insert(dargs.end(), {"--exit-layer", "1"});
    auto draft = ChildProcess::Start(testing::DraftWorkerBinary(),
                                     testing::WorkerArgs(tmp_.path() / "model", dargs));
    ASSERT_TRUE(draft.ok()) << draft.status();
    draft_ = *std::move(draft);
    auto coordinator = ChildProcess::Start(
        testing::BuiltBinary("services/coordinator/specd-coordinator"),
        {"--listen", "127.0.0.1:0", "--target", target_->address(), "--draft", draft_->address(),
         "--metrics-port", "-1", "--drain-seconds", std::to_string(drain_seconds)});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    stub_ = v1::Generation::NewStub(coordinator_->Channel());
    ASSERT_TRUE(WaitUntil([&] { return Health() == Serving::kYes; })) << coordinator_->StderrText();
  }

  enum class Serving { kYes, kNo, kUnreachable };
  Serving Health() {
    auto health = grpc::health::v1::Health::NewStub(coordinator_->Channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckResponse reply;
    if (!health->Check(&ctx, {}, &reply).ok()) return Serving::kUnreachable;
    return reply.status() == grpc::health::v1::HealthCheckResponse::SERVING ? Serving::kYes
                                                                            : Serving::kNo;
  }

  // One long stream and kShortStreams short ones, all in flight.
  void StartStreams() {
    long_ = OpenStream::Start(*stub_, Request(50, kLongTokens));
    ASSERT_NE(long_, nullptr);
    for (int i = 0; i < kShortStreams; ++i) {
      shorts_.push_back(OpenStream::Start(*stub_, Request(60 + i, kShortTokens)));
      ASSERT_NE(shorts_.back(), nullptr);
    }
  }

  void ExpectShortStreamsFinished() {
    for (auto& s : shorts_) {
      const grpc::Status st = s->Finish();
      EXPECT_TRUE(st.ok()) << st.error_message();
      EXPECT_EQ(s->tokens, kShortTokens);
      EXPECT_EQ(s->last.finish_reason(), v1::FINISH_REASON_LENGTH);
    }
  }

  // KV blocks a worker holds, from its Info; -1 when it does not answer.
  template <typename Service>
  static int64_t UsedBlocks(ChildProcess& worker) {
    auto stub = Service::NewStub(worker.Channel());
    grpc::ClientContext ctx;
    worker::v1::InfoResponse info;
    if (!stub->Info(&ctx, {}, &info).ok()) return -1;
    return info.kv_total_blocks() - info.kv_free_blocks();
  }

  ScopedTempDir tmp_;
  std::unique_ptr<ChildProcess> target_, draft_, coordinator_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<OpenStream> long_;
  std::vector<std::unique_ptr<OpenStream>> shorts_;
};

TEST_F(GracefulShutdownTest, SigtermFinishesShortStreamsRefusesNewOnesAndEndsTheLongOneClearly) {
  StartService(/*drain_seconds=*/3);
  StartStreams();
  coordinator_->Signal(SIGTERM);

  // Health turns NOT_SERVING once admission has stopped; a new request is then refused.
  ASSERT_TRUE(WaitUntil([&] { return Health() == Serving::kNo; }));
  grpc::ClientContext ctx;
  auto refused = stub_->Generate(&ctx, Request(70, 4));
  v1::GenerateResponse msg;
  EXPECT_FALSE(refused->Read(&msg));
  const grpc::Status st = refused->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), HasSubstr("shutting down and admits no new requests"));

  ExpectShortStreamsFinished();

  const grpc::Status long_status = long_->Finish();
  EXPECT_EQ(long_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(long_status.error_message(),
              HasSubstr("shut down after its drain period of 3 s (--drain-seconds) before this "
                        "request finished"));
  EXPECT_GT(long_->tokens, 0);
  EXPECT_LT(long_->tokens, kLongTokens);

  EXPECT_EQ(ExitCodeWithin(*coordinator_, std::chrono::seconds(30)), 0);
  EXPECT_THAT(coordinator_->StderrText(), HasSubstr("ended 1 unfinished request(s)"));
  // The unfinished request was released on both workers too.
  EXPECT_TRUE(WaitUntil([&] {
    return UsedBlocks<worker::v1::TargetWorker>(*target_) == 0 &&
           UsedBlocks<worker::v1::DraftWorker>(*draft_) == 0;
  }));
}

TEST_F(GracefulShutdownTest, WorkersSignalledTogetherWithTheCoordinatorServeItsDrain) {
  StartService(/*drain_seconds=*/3);
  StartStreams();
  for (ChildProcess* p : {coordinator_.get(), draft_.get(), target_.get()}) p->Signal(SIGTERM);

  // The short streams still need rounds on both workers after the signal.
  ExpectShortStreamsFinished();
  EXPECT_EQ(long_->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ExitCodeWithin(*coordinator_, std::chrono::seconds(30)), 0);
  // Workers stopping with it are no outage to report.
  EXPECT_THAT(coordinator_->StderrText(), Not(HasSubstr("is unavailable")));

  // Once the coordinator has released everything, the workers stop by themselves.
  for (ChildProcess* worker : {draft_.get(), target_.get()}) {
    EXPECT_TRUE(WaitUntil([&] {
      return worker->StderrText().find("stopped") != std::string::npos;
    })) << worker->StderrText();
    EXPECT_THAT(worker->StderrText(), HasSubstr("no sequences held; stopping"));
    EXPECT_EQ(ExitCodeWithin(*worker, std::chrono::seconds(30)), 0);
  }
}

TEST_F(GracefulShutdownTest, ASecondSignalEndsTheDrainAtOnce) {
  StartService(/*drain_seconds=*/600);
  long_ = OpenStream::Start(*stub_, Request(50, kLongTokens));
  ASSERT_NE(long_, nullptr);
  coordinator_->Signal(SIGTERM);
  ASSERT_TRUE(WaitUntil([&] { return Health() == Serving::kNo; }));
  coordinator_->Signal(SIGINT);
  const grpc::Status st = long_->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), HasSubstr("stopped by a second signal"));
  EXPECT_EQ(ExitCodeWithin(*coordinator_, std::chrono::seconds(30)), 0);
}

}  // namespace
}  // namespace specd
