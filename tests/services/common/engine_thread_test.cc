// EngineThread's watch on the back end's health: a device that becomes unusable (a CUDA sticky
// error; here a back end told to report one) is handed to the worker's handler once, after the
// job during which it was lost, and a healthy back end never is.
#include "services/common/engine_thread.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/engine/llama_engine.h"
#include "common/model/weights.h"
#include "common/synth/synth.h"
#include "common/worker/worker_runtime.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/engine/recording_backend.h"
#include "tests/test_util.h"

namespace specd {
namespace {

// The CPU (through RecordingBackend) with a health that a test can take away.
class LosableBackend final : public testing::RecordingBackend {
 public:
  LosableBackend(std::unique_ptr<kernels::Backend> cpu, const std::atomic<bool>* lost)
      : RecordingBackend(std::move(cpu)), lost_(lost) {}
  absl::Status Health() const override {
    return lost_->load() ? absl::InternalError("the test's device is lost") : absl::OkStatus();
  }

 private:
  const std::atomic<bool>* lost_;
};

class EngineThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteSynth(testing::WorkerTestSpec(), dir_.path());
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(dir_.path(), {});
    ASSERT_TRUE(weights.ok()) << weights.status();
    absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu = kernels::CreateCpuBackend(1);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    EngineOptions options;
    options.kv_capacity_tokens = 256;
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = LlamaEngine::Create(
        *std::move(weights), std::make_unique<LosableBackend>(*std::move(cpu), &lost_), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    runtime_ = std::make_unique<WorkerRuntime>(*std::move(engine), WorkerRuntimeOptions{});
  }

  // Runs one job on `thread` and waits for it.
  static void RunJob(EngineThread& thread) {
    std::promise<void> ran;
    thread.Post([&ran](WorkerRuntime&) { ran.set_value(); });
    ran.get_future().wait();
  }

  testing::ScopedTempDir dir_;
  std::atomic<bool> lost_{false};
  std::unique_ptr<WorkerRuntime> runtime_;
};

TEST_F(EngineThreadTest, ALostDeviceIsHandedToTheHandlerOnceAfterItsJob) {
  std::atomic<int> calls{0};
  std::promise<absl::Status> handed;
  EngineThread thread(std::move(runtime_), [&](const absl::Status& lost) {
    if (calls.fetch_add(1) == 0) handed.set_value(lost);
  });
  RunJob(thread);
  RunJob(thread);
  EXPECT_EQ(calls.load(), 0) << "a healthy back end was reported lost";

  lost_ = true;
  RunJob(thread);
  std::future<absl::Status> status = handed.get_future();
  ASSERT_EQ(status.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(status.get(), absl::InternalError("the test's device is lost"));
  RunJob(thread);
  thread.Stop();
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace specd
