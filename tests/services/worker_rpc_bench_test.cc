// tools/bench/services/worker_rpc_bench against a real target worker: it decodes through K = 0
// Verify calls (every reply OK, each forward pass inside its call's wall time), returns every KV
// block it took, and names what is wrong when the address is not a target worker. Its timings
// are figures to read, never asserted.
#include <fstream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "specd/worker/v1/worker.grpc.pb.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd::testing {
namespace {

namespace pb = ::specd::worker::v1;
using ::testing::HasSubstr;

std::filesystem::path BenchBinary() { return BuiltBinary("tools/bench/services/worker_rpc_bench"); }

int64_t FreeBlocks(const ChildProcess& worker) {
  auto stub = pb::TargetWorker::NewStub(worker.Channel());
  grpc::ClientContext context;
  pb::InfoResponse info;
  const grpc::Status st = stub->Info(&context, {}, &info);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return info.kv_free_blocks();
}

class WorkerRpcBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status st = PrepareModel(ModelKind::kSynthetic, tmp_.path() / "model");
    ASSERT_TRUE(st.ok()) << st;
  }
  std::unique_ptr<ChildProcess> StartWorker(bool draft) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> p =
        ChildProcess::Start(draft ? DraftWorkerBinary() : TargetWorkerBinary(),
                            WorkerArgs(tmp_.path() / "model", {"--metrics-port", "-1"}));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }
  ScopedTempDir tmp_;
};

TEST_F(WorkerRpcBenchTest, DecodesThroughTheWorkerAndReturnsItsBlocks) {
  std::unique_ptr<ChildProcess> target = StartWorker(false);
  ASSERT_TRUE(target);
  const int64_t free_before = FreeBlocks(*target);
  const std::filesystem::path json = tmp_.path() / "rpc.json";
  std::string err;
  // 60 calls of 25-token sequences: two restarts, each a Release of a sequence that held blocks.
  absl::StatusOr<int> rc =
      ChildProcess::Run(BenchBinary(),
                        {"--target", target->address(), "--calls", "60", "--steps", "25",
                         "--prompt-len", "20", "--json", json.string()},
                        &err);
  ASSERT_TRUE(rc.ok()) << rc.status();
  ASSERT_EQ(*rc, 0) << err;
  EXPECT_EQ(FreeBlocks(*target), free_before) << "the bench left KV blocks held";

  std::ifstream in(json);
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_EQ(report["calls"], 60);
  EXPECT_THAT(report["backend"].get<std::string>(), ::testing::StartsWith("cpu"));
  for (const char* arm : {"socketpair_ping_pong", "grpc_floor", "engine_thread_call", "verify_k0",
                          "verify_k0_forward"}) {
    EXPECT_GT(report[arm]["median_us"].get<double>(), 0.0) << arm;
  }
  // Each call's forward pass ran inside that call, so the time beyond it is never negative.
  EXPECT_GE(report["verify_k0_beyond_forward"]["p10_us"].get<double>(), 0.0);
  EXPECT_EQ(target->Terminate(), 0);
}

TEST_F(WorkerRpcBenchTest, SaysWhatIsWrongWithTheAddress) {
  std::unique_ptr<ChildProcess> draft = StartWorker(true);
  ASSERT_TRUE(draft);
  std::string err;
  absl::StatusOr<int> rc = ChildProcess::Run(BenchBinary(), {"--target", draft->address()}, &err);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 1);
  EXPECT_THAT(err, HasSubstr("does not serve specd.worker.v1.TargetWorker"));

  rc = ChildProcess::Run(BenchBinary(), {"--calls", "5"}, &err);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 2);
  EXPECT_THAT(err, HasSubstr("--target is required"));
  EXPECT_EQ(draft->Terminate(), 0);
}

}  // namespace
}  // namespace specd::testing
