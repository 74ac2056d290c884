#include "kernels/cpu/cpu_backend.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/kv_cache.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/validate.h"

namespace specd::kernels {
namespace {

// Host memory is the device here: every op and copy runs when it is called, so Synchronize has
// nothing to wait for.
class CpuBackend final : public Backend {
 public:
  CpuBackend(std::unique_ptr<cpu::ThreadPool> pool, cpu::CpuIsa isa)
      : pool_(std::move(pool)),
        ctx_{.pool = pool_.get(), .ops = &cpu::SimdOpsFor(isa)},
        name_(absl::StrCat("cpu-", cpu::CpuIsaName(isa))) {}

  std::string_view name() const override { return name_; }
  int num_threads() const override { return pool_->num_threads(); }
  bool SupportsKvDtype(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  absl::StatusOr<DeviceMemory> QueryDeviceMemory() const override {
    return absl::UnimplementedError("the CPU back end has no device memory; size it with flags");
  }

  absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) override {
    return Copy("Upload", device_dst, host_src, bytes);
  }
  absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) override {
    return Copy("Download", host_dst, device_src, bytes);
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override {
    return Copy("CopyDeviceToDevice", dst, src, bytes);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Matmul(const MatmulArgs& args) override { return cpu::CpuMatmul(args, ctx_); }
  absl::Status MatmulGroup(const MatmulGroupArgs& args) override {
    return cpu::CpuMatmulGroup(args, ctx_);
  }
  absl::Status RmsNorm(const RmsNormArgs& args) override { return cpu::CpuRmsNorm(args, ctx_); }
  absl::Status Rope(const RopeArgs& args) override { return cpu::CpuRope(args, ctx_); }
  absl::Status StoreKv(const StoreKvArgs& args) override { return cpu::CpuStoreKv(args, ctx_); }
  absl::Status Attention(const AttentionArgs& args) override {
    return cpu::CpuAttention(args, ctx_);
  }
  absl::Status SwiGlu(const SwiGluArgs& args) override { return cpu::CpuSwiGlu(args, ctx_); }
  absl::Status Embedding(const EmbeddingArgs& args) override {
    return cpu::CpuEmbedding(args, ctx_);
  }
  absl::Status GatherRows(const GatherRowsArgs& args) override {
    return cpu::CpuGatherRows(args, ctx_);
  }
  absl::Status CopyKvRows(const CopyKvRowsArgs& args) override {
    return cpu::CpuCopyKvRows(args, ctx_);
  }
  absl::Status CombineLogits(const CombineLogitsArgs& args) override {
    return cpu::CpuCombineLogits(args, ctx_);
  }
  absl::Status ProcessRows(const ProcessRowsArgs& args) override {
    return cpu::CpuProcessRows(args, ctx_);
  }
  absl::Status SampleRows(const SampleRowsArgs& args) override {
    return cpu::CpuSampleRows(args, ctx_);
  }
  absl::Status GatherProbs(const GatherProbsArgs& args) override {
    return cpu::CpuGatherProbs(args, ctx_);
  }
  absl::Status Logprobs(const LogprobsArgs& args) override { return cpu::CpuLogprobs(args, ctx_); }

 protected:
  absl::StatusOr<void*> AllocateRaw(int64_t bytes, MemoryKind kind) override {
    (void)kind;
    return cpu::AllocateHostMemory(bytes);
  }
  void FreeRaw(void* data, int64_t bytes, MemoryKind kind) override {
    (void)kind;
    cpu::FreeHostMemory(data, bytes);
  }

 private:
  static absl::Status Copy(std::string_view op, void* dst, const void* src, int64_t bytes) {
    SPECD_RETURN_IF_ERROR(ValidateCopyArgs(ToAbsl(op), dst, src, bytes));
    if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  const std::unique_ptr<cpu::ThreadPool> pool_;
  const cpu::CpuContext ctx_;
  const std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackendWithIsa(int num_threads, cpu::CpuIsa isa) {
  if (!cpu::CpuIsaSupported(isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CreateCpuBackend: this CPU or build cannot run the ", cpu::CpuIsaName(isa), " kernels"));
  }
  if (num_threads <= 0) num_threads = cpu::AvailableCpuCount();
  if (num_threads > cpu::ThreadPool::kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateCpuBackend: num_threads must be <= ", cpu::ThreadPool::kMaxThreads,
                     ", got ", num_threads));
  }
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<cpu::ThreadPool> pool,
                         cpu::ThreadPool::Create(num_threads));
  return std::make_unique<CpuBackend>(std::move(pool), isa);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(int num_threads) {
  return CreateCpuBackendWithIsa(num_threads, cpu::BestCpuIsa());
}

}  // namespace specd::kernels
