// The coordinator's gRPC client of a worker against a real worker process that an operator
// restarts behind its back: the next Verify is refused before it creates anything (it names the
// process it was meant for), the probe then learns the new process, and calls go on; a probe of a
// process that computes something else fails naming the change. The same over the worker's
// same-host socket (--local-socket), which the client then uses for the round's calls.
#include "services/coordinator/grpc_worker.h"

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;

// The parameter: whether the worker serves a local socket and the client uses it.
class GrpcWorkerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::PrepareModel(testing::ModelKind::kSynthetic, model()).ok());
  }
  std::filesystem::path model() const { return tmp_.path() / "model"; }
  std::string socket() const { return "unix:" + (tmp_.path() / "target.sock").string(); }
  std::string local_socket() const { return (tmp_.path() / "target.local").string(); }
  std::unique_ptr<ChildProcess> StartTarget(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--listen", socket(), "--threads", "1"};
    if (GetParam()) args.insert(args.end(), {"--local-socket", local_socket()});
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> p =
        ChildProcess::Start(testing::TargetWorkerBinary(), testing::WorkerArgs(model(), args));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  testing::ScopedTempDir tmp_;
};

VerifySequenceRequest NewSequence(SeqId id) {
  VerifySequenceRequest r;
  r.seq = id;
  r.catch_up = {1, 17, 23, 42};
  r.prompt_len = 4;
  r.sampling.temperature = 0.0f;
  return r;
}

TEST_P(GrpcWorkerTest, ARestartBetweenCallsIsRefusedUntilTheWorkerIsProbedAgain) {
  std::unique_ptr<ChildProcess> target = StartTarget();
  ASSERT_NE(target, nullptr);
  absl::StatusOr<std::unique_ptr<GrpcWorker>> worker = GrpcWorker::Connect(
      GrpcWorker::Role::kTarget, socket(), absl::Seconds(10), absl::Seconds(5), GetParam());
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->UsesLocalSocket(), GetParam());
  const VerifySequenceRequest first = NewSequence(1);
  ASSERT_TRUE((*worker)->Verify({&first, 1}).ok());

  // The same flags: a plain restart the client did not see.
  target.reset();
  target = StartTarget();
  ASSERT_NE(target, nullptr);
  const VerifySequenceRequest second = NewSequence(2);
  // The first calls may still meet the old connection ("Broken pipe") or none; once the channel
  // reaches the new process, that process refuses the call. None may be served.
  absl::Status refused;
  for (int i = 0; i < 50; ++i) {
    refused = (*worker)->Verify({&second, 1}).status();
    ASSERT_FALSE(refused.ok()) << "a call reached the restarted process before any probe";
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    if (absl::StrContains(refused.message(), "started after")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("started after the caller last read its Info"));
  absl::StatusOr<WorkerProbe> probe = (*worker)->Probe(absl::Seconds(5));
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_NE(probe->epoch, (*worker)->info().epoch());   // the new process
  EXPECT_EQ((*worker)->UsesLocalSocket(), GetParam());  // the new process's socket
  EXPECT_EQ(probe->max_pass_tokens, (*worker)->info().max_pass_tokens());
  absl::StatusOr<std::vector<VerifySequenceResult>> served = (*worker)->Verify({&second, 1});
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_EQ(served->size(), 1u);
  EXPECT_TRUE((*served)[0].status.ok()) << (*served)[0].status;

  // Another KV dtype: the probe refuses the process, naming what changed.
  target.reset();
  target = StartTarget({"--kv-dtype", "bf16"});
  ASSERT_NE(target, nullptr);
  EXPECT_EQ((*worker)->Verify({&second, 1}).status().code(), absl::StatusCode::kUnavailable);
  const absl::StatusOr<WorkerProbe> changed = (*worker)->Probe(absl::Seconds(5));
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(changed.status().message(), HasSubstr("target worker at " + socket() +
                                                    ": it came back with kv_dtype bf16 (was f32)"));
}

// A socket the client cannot reach (a worker on another host, or in a container whose sockets
// are not shared): Info names it, and the calls stay on gRPC.
TEST_P(GrpcWorkerTest, AnUnreachableSocketLeavesTheCallsOnGrpc) {
  const std::string elsewhere = (tmp_.path() / "elsewhere.sock").string();
  std::unique_ptr<ChildProcess> target =
      StartTarget(GetParam() ? std::vector<std::string>{}
                             : std::vector<std::string>{"--local-socket", elsewhere});
  ASSERT_NE(target, nullptr);
  const std::string named = GetParam() ? local_socket() : elsewhere;
  ASSERT_EQ(std::filesystem::remove(named), true);
  absl::StatusOr<std::unique_ptr<GrpcWorker>> worker = GrpcWorker::Connect(
      GrpcWorker::Role::kTarget, socket(), absl::Seconds(10), absl::Seconds(5), true);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->info().local_socket(), named);
  EXPECT_FALSE((*worker)->UsesLocalSocket());
  const VerifySequenceRequest first = NewSequence(1);
  const absl::StatusOr<std::vector<VerifySequenceResult>> served = (*worker)->Verify({&first, 1});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE((*served)[0].status.ok()) << (*served)[0].status;
}

INSTANTIATE_TEST_SUITE_P(Transport, GrpcWorkerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "LocalSocket" : "Grpc";
                         });

}  // namespace
}  // namespace specd
