// A back end that records as CUDA graphs do, computing on the CPU: between BeginRecording and
// EndRecording each op is checked (kernels/validate.h) and kept with its arguments, not run;
// Replay runs the kept ops in order, reading whatever the memory they point to holds then. The
// engine's recorded forward passes (shape buckets, padding, replays after new metadata, stale
// recordings, eviction) are CUDA-only code paths otherwise; on this back end every engine test
// exercises them in CI, where no GPU is (SPECD_TEST_BACKEND=cpu-recording).
#ifndef SPECD_TESTS_COMMON_ENGINE_RECORDING_BACKEND_H_
#define SPECD_TESTS_COMMON_ENGINE_RECORDING_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/validate.h"

namespace specd::testing {

class RecordingBackend : public kernels::Backend {
 public:
  // Computes on `inner` (a CPU back end); allocates host memory of its own.
  explicit RecordingBackend(std::unique_ptr<kernels::Backend> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return "cpu-recording"; }
  int num_threads() const override { return inner_->num_threads(); }
  bool SupportsKvDtype(kernels::DType dtype) const override {
    return inner_->SupportsKvDtype(dtype);
  }
  absl::StatusOr<kernels::DeviceMemory> QueryDeviceMemory() const override {
    return inner_->QueryDeviceMemory();
  }

  absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) override {
    if (recording_) return Refused("Upload");
    return Enqueue(kernels::ValidateCopyArgs("Upload", device_dst, host_src, bytes),
                   [=, this] { return inner_->Upload(device_dst, host_src, bytes); });
  }
  absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) override {
    if (recording_) return Refused("Download");
    return Enqueue(absl::OkStatus(),
                   [=, this] { return inner_->Download(host_dst, device_src, bytes); });
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override {
    return Enqueue(kernels::ValidateCopyArgs("CopyDeviceToDevice", dst, src, bytes),
                   [=, this] { return inner_->CopyDeviceToDevice(dst, src, bytes); });
  }
  absl::Status Synchronize() override {
    if (recording_) return Refused("Synchronize");
    return inner_->Synchronize();
  }

#define SPECD_RECORDED_OP(Op)                                                            \
  absl::Status Op(const kernels::Op##Args& a) override {                                 \
    return Enqueue(kernels::Validate##Op##Args(a), [a, this] { return inner_->Op(a); }); \
  }
  SPECD_RECORDED_OP(Matmul)
  SPECD_RECORDED_OP(MatmulGroup)
  SPECD_RECORDED_OP(RmsNorm)
  SPECD_RECORDED_OP(Rope)
  SPECD_RECORDED_OP(StoreKv)
  SPECD_RECORDED_OP(Attention)
  SPECD_RECORDED_OP(SwiGlu)
  SPECD_RECORDED_OP(Embedding)
  SPECD_RECORDED_OP(GatherRows)
  SPECD_RECORDED_OP(CopyKvRows)
  SPECD_RECORDED_OP(CombineLogits)
  SPECD_RECORDED_OP(ProcessRows)
  SPECD_RECORDED_OP(SampleRows)
  SPECD_RECORDED_OP(GatherProbs)
  SPECD_RECORDED_OP(Logprobs)
#undef SPECD_RECORDED_OP

  bool SupportsRecording() const override { return true; }
  absl::Status BeginRecording() override {
    if (recording_) return absl::FailedPreconditionError("BeginRecording: already recording");
    recording_ = true;
    steps_.clear();
    recording_error_ = absl::OkStatus();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<kernels::RecordedWork>> EndRecording() override {
    if (!recording_) return absl::FailedPreconditionError("EndRecording: not recording");
    recording_ = false;
    std::vector<Step> steps = std::exchange(steps_, {});
    if (absl::Status failed = std::exchange(recording_error_, absl::OkStatus()); !failed.ok()) {
      return failed;
    }
    ++recordings_;
    return std::make_unique<Steps>(std::move(steps));
  }
  absl::Status Replay(const kernels::RecordedWork& work) override {
    const auto* recorded = dynamic_cast<const Steps*>(&work);
    if (recorded == nullptr) return absl::InvalidArgumentError("Replay: not a recording of mine");
    return Enqueue(absl::OkStatus(), [recorded, this] {
      ++replays_;
      for (const Step& step : recorded->steps) {
        if (absl::Status st = step(); !st.ok()) return st;
      }
      return absl::OkStatus();
    });
  }

  // What the engine did with recordings, for tests to see that they were really used.
  int64_t recordings() const { return recordings_; }
  int64_t replays() const { return replays_; }
  // Ops, copies and replays run outside a recording.
  int64_t eager_ops() const { return eager_ops_; }

 protected:
  using Step = std::function<absl::Status()>;

  kernels::Backend& inner() { return *inner_; }

  // Runs `step` now, or keeps it when recording. As the CUDA back end: an op whose argument
  // check (`checked`) fails is not recorded, and spoils the recording.
  absl::Status Enqueue(const absl::Status& checked, Step step) {
    if (!recording_) {
      ++eager_ops_;
      return step();
    }
    if (!checked.ok()) {
      if (recording_error_.ok()) recording_error_ = checked;
      return checked;
    }
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocateRaw(int64_t bytes, kernels::MemoryKind kind) override {
    (void)kind;
    if (recording_) return Refused("Allocate");
    return kernels::cpu::AllocateHostMemory(bytes);
  }
  void FreeRaw(void* data, int64_t bytes, kernels::MemoryKind kind) override {
    (void)kind;
    kernels::cpu::FreeHostMemory(data, bytes);
  }

 private:
  struct Steps final : kernels::RecordedWork {
    explicit Steps(std::vector<Step> s) : steps(std::move(s)) {}
    const std::vector<Step> steps;
  };

  static absl::Status Refused(const char* call) {
    return absl::FailedPreconditionError(absl::StrCat(call, " while recording"));
  }
  std::unique_ptr<kernels::Backend> inner_;
  bool recording_ = false;
  std::vector<Step> steps_;
  absl::Status recording_error_;
  int64_t recordings_ = 0;
  int64_t replays_ = 0;
  int64_t eager_ops_ = 0;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_ENGINE_RECORDING_BACKEND_H_
