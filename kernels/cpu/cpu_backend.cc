#include "kernels/cpu/cpu_backend.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"

namespace specd::kernels {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::unique_ptr<cpu::ThreadPool> pool, cpu::CpuIsa isa)
      : pool_(std::move(pool)),
        ctx_{.pool = pool_.get(), .ops = &cpu::SimdOpsFor(isa)},
        name_(absl::StrCat("cpu-", cpu::CpuIsaName(isa))) {}

  std::string_view name() const override { return name_; }
  int num_threads() const override { return pool_->num_threads(); }

  absl::Status Matmul(const MatmulArgs& args) override { return cpu::CpuMatmul(args, ctx_); }
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
  absl::Status Add(const AddArgs& args) override { return cpu::CpuAdd(args, ctx_); }

 private:
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
