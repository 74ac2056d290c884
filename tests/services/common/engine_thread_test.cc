// EngineThread's watch on the back end's health: a device that becomes unusable (a CUDA sticky
// error; here a back end told to report one) is handed to the worker's handler once, after the
// job during which it was lost, and a healthy back end never is.
#include "services/common/engine_thread.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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

TEST_F(EngineThreadTest, RunOrPostRunsOnTheCallerWhenIdleAndAfterEarlierJobsOtherwise) {
  EngineThread thread(std::move(runtime_), [](const absl::Status&) {});
  // Idle: the caller's own thread runs it, and has when RunOrPost returns.
  std::thread::id ran_on;
  thread.RunOrPost([&](WorkerRuntime&) { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());

  // Busy: it is queued behind the running job and the one queued after it, and runs on the
  // engine thread in that order.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> started;
  std::vector<int> order;
  absl::Mutex mu;
  thread.Post([&](WorkerRuntime&) {
    started.set_value();
    released.wait();
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  thread.Post([&](WorkerRuntime&) {
    absl::MutexLock lock(&mu);
    order.push_back(2);
  });
  started.get_future().wait();
  std::promise<std::thread::id> third;
  thread.RunOrPost([&](WorkerRuntime&) {
    {
      absl::MutexLock lock(&mu);
      order.push_back(3);
    }
    third.set_value(std::this_thread::get_id());
  });
  release.set_value();
  EXPECT_NE(third.get_future().get(), std::this_thread::get_id());
  thread.Stop();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

}  // namespace
}  // namespace specd
