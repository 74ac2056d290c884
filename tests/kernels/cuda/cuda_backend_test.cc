// The CUDA back end's own contract around recording and errors (kernels/backend.h), beyond what
// the kernels do:
//  * Synchronize, Download and Allocate while recording are refused with FAILED_PRECONDITION
//    before any CUDA call, so the recording goes on and replays, and a device error waiting for
//    the next Synchronize is still reported by it;
//  * an op or copy that fails while recording makes EndRecording discard the recording and
//    return the failure, and the stream then runs eagerly again;
//  * a Buffer freed while recording neither breaks the recording nor leaks: its memory is
//    released at EndRecording;
//  * BeginRecording twice, or EndRecording without a recording, is FAILED_PRECONDITION;
//  * a failed CUDA call (a graph launched into a capturing stream) leaves no stale error behind
//    for the next op's launch check;
//  * kernels launch as programmatic dependent launches where the device has them, and agree with
//    plain launches.
// Every test skips, saying why, where no CUDA device is present. No test asserts between
// BeginRecording and EndRecording: a failure there would leave the stream capturing.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/conformance/backend_under_test.h"

namespace specd::kernels {
namespace {

using conformance::Device;

// A status whose code is `code` and whose message contains `part`.
::testing::AssertionResult Is(const absl::Status& status, absl::StatusCode code, const char* part) {
  if (status.code() == code && absl::StrContains(status.message(), part)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "got " << status << ", want " << absl::StatusCodeToString(code) << " containing \""
         << part << "\"";
}

class CudaBackendTest : public ::testing::Test {
 protected:
  static constexpr int64_t kN = 4, kDim = 32, kSize = kN * kDim;

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackend(0);
    if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status();
    backend_ = *std::move(b);
    device_ = std::make_unique<Device>(*backend_);
    // y += x in exact float arithmetic: every sum is a small multiple of 1/4.
    for (int64_t i = 0; i < kSize; ++i) {
      y0_.push_back(static_cast<float>(i));
      x0_.push_back(0.25f * static_cast<float>(i % 17));
    }
    y_ = device_->Put(y0_);
    x_ = device_->Put(x0_);
    std::vector<float> identity(kDim * kDim, 0.0f);
    for (int64_t i = 0; i < kDim; ++i) identity[i * kDim + i] = 1.0f;
    identity_ = device_->Put(identity);
    ASSERT_NE(y_, nullptr);
    ASSERT_NE(x_, nullptr);
    ASSERT_NE(identity_, nullptr);
  }

  // y += x · Iᵀ: the product of x with the identity is x exactly (the other terms are zeros).
  MatmulArgs AddXToYArgs() const {
    return {x_, {identity_, DType::kF32, kDim, kDim}, y_, kN, /*accumulate=*/true};
  }
  absl::Status AddXToY() { return backend_->Matmul(AddXToYArgs()); }
  // y0 + times * x0.
  std::vector<float> YAfter(int times) const {
    std::vector<float> y = y0_;
    for (int t = 0; t < times; ++t) {
      for (int64_t i = 0; i < kSize; ++i) y[i] += x0_[i];
    }
    return y;
  }
  std::vector<float> Y() { return device_->Get(y_, kSize); }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Device> device_;  // after backend_: its buffers are freed first
  std::vector<float> y0_, x0_;
  float* y_ = nullptr;
  float* x_ = nullptr;
  float* identity_ = nullptr;
};

TEST_F(CudaBackendTest, SynchronizeCopiesFromOrToHostAndAllocateWhileRecordingAreRefused) {
  absl::StatusOr<Buffer> staging = backend_->Allocate(kSize * 4, MemoryKind::kStaging, "test");
  ASSERT_TRUE(staging.ok()) << staging.status();

  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status add = AddXToY();
  const absl::Status sync = backend_->Synchronize();
  const absl::Status download = backend_->Download(staging->data(), y_, kSize * 4);
  const absl::Status upload = backend_->Upload(x_, staging->data(), kSize * 4);
  const absl::StatusOr<Buffer> allocated =
      backend_->Allocate(4096, MemoryKind::kScratch, "a buffer while recording");
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();

  EXPECT_TRUE(add.ok()) << add;
  EXPECT_TRUE(Is(sync, absl::StatusCode::kFailedPrecondition, "Synchronize while recording"));
  EXPECT_TRUE(Is(download, absl::StatusCode::kFailedPrecondition, "Download while recording"));
  EXPECT_TRUE(Is(upload, absl::StatusCode::kFailedPrecondition, "Upload while recording"));
  // Backend::Allocate adds what the buffer was for, and keeps the back end's code.
  EXPECT_TRUE(
      Is(allocated.status(), absl::StatusCode::kFailedPrecondition, "Allocate while recording"));
  ASSERT_TRUE(work.ok()) << work.status();

  EXPECT_EQ(Y(), YAfter(0)) << "recording ran the product";
  ASSERT_TRUE(backend_->Replay(**work).ok());
  EXPECT_EQ(Y(), YAfter(1));
  ASSERT_TRUE(backend_->Replay(**work).ok());
  EXPECT_EQ(Y(), YAfter(2));
}

TEST_F(CudaBackendTest, ABufferFreedWhileRecordingIsReleasedAtEndRecording) {
  constexpr int64_t kBytes = int64_t{64} << 20;
  const int64_t before = backend_->allocated_bytes(MemoryKind::kScratch);
  absl::StatusOr<Buffer> held = backend_->Allocate(kBytes, MemoryKind::kScratch, "test");
  ASSERT_TRUE(held.ok()) << held.status();
  const absl::StatusOr<DeviceMemory> with_buffer = backend_->QueryDeviceMemory();
  ASSERT_TRUE(with_buffer.ok()) << with_buffer.status();

  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status add = AddXToY();
  *held = Buffer();
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();

  EXPECT_TRUE(add.ok()) << add;
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ(backend_->allocated_bytes(MemoryKind::kScratch), before);
  const absl::StatusOr<DeviceMemory> after = backend_->QueryDeviceMemory();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->free_bytes, with_buffer->free_bytes + kBytes / 2) << "the buffer leaked";
  ASSERT_TRUE(backend_->Replay(**work).ok());
  EXPECT_EQ(Y(), YAfter(1));
}

TEST_F(CudaBackendTest, ARefusedSynchronizeWhileRecordingKeepsAPendingDeviceError) {
  const std::vector<float> table(10 * 8, 1.0f);
  const std::vector<int32_t> ids = {3, 10};  // 10 is out of range: only the kernel sees it
  float* out = device_->Output<float>(16);
  ASSERT_TRUE(
      backend_->Embedding({{device_->Put(table), DType::kF32, 10, 8}, device_->Put(ids), out, 2})
          .ok());

  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status add = AddXToY();
  const absl::Status refused = backend_->Synchronize();
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();

  EXPECT_TRUE(add.ok()) << add;
  EXPECT_TRUE(Is(refused, absl::StatusCode::kFailedPrecondition, "Synchronize while recording"));
  EXPECT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE(
      Is(backend_->Synchronize(), absl::StatusCode::kInvalidArgument, "Embedding: ids at index 1"));
  EXPECT_TRUE(backend_->Synchronize().ok());
}

TEST_F(CudaBackendTest, AnOpThatFailsWhileRecordingMakesEndRecordingDiscardIt) {
  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status good = AddXToY();
  MatmulArgs no_input = AddXToYArgs();
  no_input.x = nullptr;
  const absl::Status bad = backend_->Matmul(no_input);  // fails its host-side check
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();

  EXPECT_TRUE(good.ok()) << good;
  EXPECT_TRUE(Is(bad, absl::StatusCode::kInvalidArgument, "Matmul: x must not be null"));
  ASSERT_FALSE(work.ok()) << "a recording that misses the failed Matmul was kept";
  EXPECT_TRUE(Is(work.status(), absl::StatusCode::kInvalidArgument, "Matmul: x must not be null"));
  EXPECT_TRUE(Is(work.status(), absl::StatusCode::kInvalidArgument, "EndRecording"));

  // Nothing ran, and the stream runs eagerly again.
  EXPECT_EQ(Y(), YAfter(0));
  ASSERT_TRUE(AddXToY().ok());
  EXPECT_EQ(Y(), YAfter(1));

  // The failure belonged to that recording only: the next one is kept and replays.
  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status again = AddXToY();
  absl::StatusOr<std::unique_ptr<RecordedWork>> next = backend_->EndRecording();
  EXPECT_TRUE(again.ok()) << again;
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(backend_->Replay(**next).ok());
  EXPECT_EQ(Y(), YAfter(2));
}

TEST_F(CudaBackendTest, ACopyThatFailsWhileRecordingMakesEndRecordingDiscardIt) {
  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status good = AddXToY();
  const absl::Status bad = backend_->CopyDeviceToDevice(y_, nullptr, 16);
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();

  EXPECT_TRUE(good.ok()) << good;
  EXPECT_TRUE(Is(bad, absl::StatusCode::kInvalidArgument, "CopyDeviceToDevice: null pointer"));
  EXPECT_TRUE(Is(work.status(), absl::StatusCode::kInvalidArgument, "CopyDeviceToDevice"));
  EXPECT_EQ(Y(), YAfter(0));
}

TEST_F(CudaBackendTest, RecordingCallsOutOfOrderAreRefused) {
  EXPECT_TRUE(Is(backend_->EndRecording().status(), absl::StatusCode::kFailedPrecondition,
                 "EndRecording: not recording"));

  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status add = AddXToY();
  const absl::Status twice = backend_->BeginRecording();
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();

  EXPECT_TRUE(add.ok()) << add;
  EXPECT_TRUE(Is(twice, absl::StatusCode::kFailedPrecondition, "BeginRecording: already"));
  ASSERT_TRUE(work.ok()) << work.status();  // the first recording went on
  ASSERT_TRUE(backend_->Replay(**work).ok());
  EXPECT_EQ(Y(), YAfter(1));
  EXPECT_TRUE(Is(backend_->EndRecording().status(), absl::StatusCode::kFailedPrecondition,
                 "EndRecording: not recording"));
}

// A copy that fails inside CUDA cannot be provoked safely (a bad device address faults the
// context for good), but a graph launched into a capturing stream is refused by CUDA
// (cudaErrorStreamCaptureUnsupported) where the driver does not capture it as a child graph.
TEST_F(CudaBackendTest, AFailedCudaCallLeavesNoStaleErrorForTheNextOp) {
  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status add = AddXToY();
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend_->EndRecording();
  ASSERT_TRUE(add.ok()) << add;
  ASSERT_TRUE(work.ok()) << work.status();
  (void)cudaGetLastError();  // start clean, whatever earlier tests in this process left

  ASSERT_TRUE(backend_->BeginRecording().ok());
  const absl::Status nested = backend_->Replay(**work);
  const cudaError_t left = cudaPeekAtLastError();
  absl::StatusOr<std::unique_ptr<RecordedWork>> outer = backend_->EndRecording();
  if (nested.ok()) {
    GTEST_SKIP() << "this driver records a graph launch into a capturing stream, so no CUDA call "
                    "fails here";
  }

  EXPECT_EQ(left, cudaSuccess) << "the failed Replay (" << nested << ") left "
                               << cudaGetErrorName(left) << " for the next op's launch check";
  EXPECT_FALSE(outer.ok()) << "the recording with the failed Replay was kept";
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  ASSERT_TRUE(AddXToY().ok());
  EXPECT_EQ(Y(), YAfter(1));
}

// Programmatic dependent launches are on wherever the device has them: the probe at creation
// (two kernels, eager and recorded) found them working, or the name says why not. Chained ops, a
// recording's replays and a download then agree with a back end that launches plainly.
TEST_F(CudaBackendTest, KernelsLaunchProgrammaticallyAndAgreeWithPlainLaunches) {
  const std::string name(backend_->name());
  EXPECT_EQ(name.find("plain launches"), std::string::npos) << name;
  CudaBackendOptions plain_options;
  plain_options.programmatic_launch = false;
  absl::StatusOr<std::unique_ptr<Backend>> plain = CreateCudaBackendWithOptions(plain_options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  Device plain_device(**plain);
  float* plain_y = plain_device.Put(y0_);
  const float* plain_x = plain_device.Put(x0_);
  std::vector<float> identity(kDim * kDim, 0.0f);
  for (int64_t i = 0; i < kDim; ++i) identity[i * kDim + i] = 1.0f;
  const MatmulArgs plain_add{
      plain_x, {plain_device.Put(identity), DType::kF32, kDim, kDim}, plain_y, kN, true};

  for (Backend* b : {backend_.get(), plain->get()}) {
    const MatmulArgs add = b == backend_.get() ? AddXToYArgs() : plain_add;
    // Each product reads the sum the one before it wrote.
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(b->Matmul(add).ok());
    ASSERT_TRUE(b->BeginRecording().ok());
    const absl::Status recorded = b->Matmul(add);
    const absl::Status recorded_again = b->Matmul(add);
    absl::StatusOr<std::unique_ptr<RecordedWork>> work = b->EndRecording();
    ASSERT_TRUE(recorded.ok()) << recorded;
    ASSERT_TRUE(recorded_again.ok()) << recorded_again;
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE(b->Replay(**work).ok());
    ASSERT_TRUE(b->Replay(**work).ok());
  }
  EXPECT_EQ(Y(), YAfter(7));
  EXPECT_EQ(plain_device.Get(plain_y, kSize), YAfter(7));
}

}  // namespace
}  // namespace specd::kernels
