#include "kernels/backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/absl_string.h"
#include "base/status_macros.h"

#if SPECD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace specd::kernels {

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kWeights:
      return "weights";
    case MemoryKind::kKvCache:
      return "kv_cache";
    case MemoryKind::kScratch:
      return "scratch";
    case MemoryKind::kRows:
      return "rows";
    case MemoryKind::kStaging:
      return "staging";
  }
  return "unknown";
}

std::string_view RowErrorMessage(int32_t code) {
  switch (code) {
    case kRowOk:
      return "ok";
    case kRowNanLogit:
      return "the model produced a NaN logit";
    case kRowNoFiniteLogit:
      return "every token's logit is -inf after penalties, temperature and top-k; there is no "
             "distribution to sample from";
    case kRowBadHistory:
      return "a token id of the penalty history is outside the vocabulary";
    case kRowEmpty:
      return "the probability row has no positive entry to sample";
  }
  return "unknown row error";
}

Buffer::~Buffer() { Reset(); }

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      kind_(other.kind_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    kind_ = other.kind_;
  }
  return *this;
}

void Buffer::Reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_, bytes_, kind_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<Buffer> Backend::Allocate(int64_t bytes, MemoryKind kind, std::string_view what) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot allocate ", bytes, " bytes for ", ToAbsl(what)));
  }
  absl::StatusOr<void*> data = AllocateRaw(bytes, kind);
  if (!data.ok()) {
    // The back end's code stands: out of memory is RESOURCE_EXHAUSTED, a broken device or an
    // allocation while recording is not.
    return absl::Status(
        data.status().code(),
        absl::StrCat("cannot allocate ", bytes, " bytes (", bytes >> 20, " MiB) of ",
                     ToAbsl(MemoryKindName(kind)), " memory for ", ToAbsl(what), " on ",
                     ToAbsl(name()), ": ", data.status().message()));
  }
  allocated_[static_cast<size_t>(kind)].fetch_add(bytes, std::memory_order_relaxed);
  return Buffer(this, *data, bytes, kind);
}

void Backend::Free(void* data, int64_t bytes, MemoryKind kind) {
  allocated_[static_cast<size_t>(kind)].fetch_sub(bytes, std::memory_order_relaxed);
  FreeRaw(data, bytes, kind);
}

absl::Status Backend::BeginRecording() {
  return absl::UnimplementedError(
      absl::StrCat("the ", ToAbsl(name()), " back end does not record"));
}

absl::StatusOr<std::unique_ptr<RecordedWork>> Backend::EndRecording() {
  return absl::UnimplementedError(
      absl::StrCat("the ", ToAbsl(name()), " back end does not record"));
}

absl::Status Backend::Replay(const RecordedWork& work) {
  (void)work;
  return absl::UnimplementedError(
      absl::StrCat("the ", ToAbsl(name()), " back end does not record"));
}

absl::StatusOr<BackendKind> ParseBackendKind(std::string_view name) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  if (name == "auto") return BackendKind::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown back end \"", ToAbsl(name), "\"; expected cpu, cuda or auto"));
}

std::string_view BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kAuto:
      return "auto";
  }
  return "?";
}

#if SPECD_WITH_CUDA
namespace {

CudaBackendOptions CudaOptions(const BackendOptions& options) {
  CudaBackendOptions cuda;
  cuda.device = options.device;
  cuda.programmatic_launch = options.programmatic_launch;
  return cuda;
}

}  // namespace
#endif

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  switch (options.kind) {
    case BackendKind::kCpu:
      return CreateCpuBackend(options.num_threads);
    case BackendKind::kCuda:
#if SPECD_WITH_CUDA
      return CreateCudaBackendWithOptions(CudaOptions(options));
#else
      return absl::FailedPreconditionError(
          "--backend cuda: this build of specd has no CUDA back end (no CUDA toolkit was found "
          "when it was built); rebuild on a machine with nvcc and cuBLAS, or use --backend cpu");
#endif
    case BackendKind::kAuto:
#if SPECD_WITH_CUDA
      if (AutoChoosesCuda()) {
        absl::StatusOr<std::unique_ptr<Backend>> cuda =
            CreateCudaBackendWithOptions(CudaOptions(options));
        if (cuda.ok()) return cuda;
        return absl::Status(cuda.status().code(),
                            absl::StrCat("--backend auto chose CUDA since an NVIDIA driver is "
                                         "loaded: ",
                                         cuda.status().message()));
      }
#endif
      return CreateCpuBackend(options.num_threads);
  }
  return absl::InvalidArgumentError("unknown back end kind");
}

}  // namespace specd::kernels
