#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/processed.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/validate.h"

namespace specd::kernels {
namespace {

using cuda::CudaStatus;

struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
using UniqueStream = std::unique_ptr<CUstream_st, StreamDeleter>;

struct HostDeleter {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using UniqueHost = std::unique_ptr<void, HostDeleter>;

// Makes `device` current on the calling thread (a worker calls from one engine thread, tests
// from others), device 0 too: the thread may have made another device current (another back
// end, a library). It sets it only when another is current: cheap, and no cudaSetDevice runs
// inside a recording, where every call finds the device BeginRecording made current.
absl::Status MakeCurrent(int device) {
  int current = -1;
  if (CudaStatus(cudaGetDevice(&current), "cudaGetDevice").ok() && current == device) {
    return absl::OkStatus();
  }
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

class CudaGraph final : public RecordedWork {
 public:
  CudaGraph(int device, cudaGraph_t graph, cudaGraphExec_t exec)
      : device_(device), graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    (void)MakeCurrent(device_);
    (void)CudaStatus(cudaGraphExecDestroy(exec_), "cudaGraphExecDestroy");
    (void)CudaStatus(cudaGraphDestroy(graph_), "cudaGraphDestroy");
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }

 private:
  int device_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

// Synchronize, Upload, Download or Allocate between BeginRecording and EndRecording
// (kernels/backend.h forbids them there): refused before any CUDA call, which would invalidate the
// capture, so the recording goes on and a device error waiting for the next Synchronize stays
// recorded.
absl::Status RefusedWhileRecording(const char* call) {
  return absl::FailedPreconditionError(
      absl::StrCat(call,
                   " while recording (between BeginRecording and EndRecording): nothing may "
                   "allocate, upload, download or synchronize until EndRecording; the recording "
                   "goes on"));
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaBackendOptions& options, std::string name, UniqueStream stream,
              UniqueHost error_host, cuda::DeviceError* error_device, int sm_count,
              bool programmatic_launch)
      : options_(options),
        name_(std::move(name)),
        stream_(std::move(stream)),
        error_host_(std::move(error_host)) {
    ctx_.error = error_device;
    ctx_.sm_count = sm_count;
    ctx_.attention_split = options.attention_split;
    ctx_.programmatic_launch = programmatic_launch;
  }

  ~CudaBackend() override {
    // Buffers still alive belong to callers; the workspace is ours and goes first.
    (void)Use();
    if (recording_) (void)EndRecording();  // a stream must not be destroyed while capturing
    (void)cudaStreamSynchronize(stream_.get());
    workspace_ = Buffer();
  }

  absl::Status Init() {
    if (options_.workspace_bytes > 0) {
      SPECD_ASSIGN_OR_RETURN(workspace_, Allocate(options_.workspace_bytes, MemoryKind::kScratch,
                                                  "the CUDA op workspace"));
      ctx_.workspace = workspace_.data();
      ctx_.workspace_bytes = workspace_.bytes();
    }
    return absl::OkStatus();
  }

  std::string_view name() const override { return name_; }
  int num_threads() const override { return 0; }
  bool SupportsKvDtype(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  absl::StatusOr<DeviceMemory> QueryDeviceMemory() const override {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    SPECD_RETURN_IF_ERROR(Use());
    SPECD_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    return DeviceMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
  }

  absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) override {
    if (recording_) return RefusedWhileRecording("Upload");
    return Copy("Upload", device_dst, host_src, bytes, cudaMemcpyHostToDevice);
  }
  absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) override {
    if (recording_) return RefusedWhileRecording("Download");
    return Copy("Download", host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override {
    return Copy("CopyDeviceToDevice", dst, src, bytes, cudaMemcpyDeviceToDevice);
  }

  absl::Status Synchronize() override {
    if (recording_) return RefusedWhileRecording("Synchronize");
    SPECD_RETURN_IF_ERROR(Use());
    const cudaError_t e = cudaStreamSynchronize(stream_.get());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      // A claim made before the failure would otherwise be reported by a later, healthy call.
      *static_cast<cuda::DeviceError*>(error_host_.get()) = cuda::DeviceError();
      return absl::InternalError(absl::StrCat("CUDA execution failed on ", name_, ": ",
                                              cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    }
    auto* error = static_cast<cuda::DeviceError*>(error_host_.get());
    if (error->claimed != 0) {
      const std::string message = cuda::DeviceErrorMessage(*error);
      *error = cuda::DeviceError();
      return absl::InvalidArgumentError(message);
    }
    return absl::OkStatus();
  }

  absl::Status Health() const override {
    // Querying a capturing stream would invalidate the capture; the recorded pass reports its
    // own failures.
    if (recording_) return absl::OkStatus();
    const cudaError_t e = cudaStreamQuery(stream_.get());
    if (e == cudaSuccess || e == cudaErrorNotReady) return absl::OkStatus();
    if (!cuda::IsStickyError(e)) {
      (void)cudaGetLastError();  // not the next op's failure
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("the CUDA context on ", name_, " is lost: ",
                                            cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }

  absl::Status Matmul(const MatmulArgs& a) override {
    return Enqueue([&] {
      return cuda::LaunchMatmul(a, ctx_, stream_.get(), options_.matmul_tokens_per_warp);
    });
  }
  absl::Status MatmulGroup(const MatmulGroupArgs& a) override {
    return Enqueue([&] {
      return cuda::LaunchMatmulGroup(a, ctx_, stream_.get(), options_.matmul_tokens_per_warp);
    });
  }
  absl::Status RmsNorm(const RmsNormArgs& a) override {
    return Enqueue([&] { return cuda::LaunchRmsNorm(a, ctx_, stream_.get()); });
  }
  absl::Status Rope(const RopeArgs& a) override {
    return Enqueue([&] { return cuda::LaunchRope(a, ctx_, stream_.get()); });
  }
  absl::Status StoreKv(const StoreKvArgs& a) override {
    return Enqueue([&] { return cuda::LaunchStoreKv(a, ctx_, stream_.get()); });
  }
  absl::Status Attention(const AttentionArgs& a) override {
    return Enqueue([&] { return cuda::LaunchAttention(a, ctx_, stream_.get()); });
  }
  absl::Status SwiGlu(const SwiGluArgs& a) override {
    return Enqueue([&] { return cuda::LaunchSwiGlu(a, ctx_, stream_.get()); });
  }
  absl::Status Embedding(const EmbeddingArgs& a) override {
    return Enqueue([&] { return cuda::LaunchEmbedding(a, ctx_, stream_.get()); });
  }
  absl::Status GatherRows(const GatherRowsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchGatherRows(a, ctx_, stream_.get()); });
  }
  absl::Status CopyKvRows(const CopyKvRowsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchCopyKvRows(a, ctx_, stream_.get()); });
  }
  absl::Status CombineLogits(const CombineLogitsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchCombineLogits(a, ctx_, stream_.get()); });
  }
  absl::Status ProcessRows(const ProcessRowsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchProcessRows(a, ctx_, stream_.get()); });
  }
  absl::Status SampleRows(const SampleRowsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchSampleRows(a, ctx_, stream_.get()); });
  }
  absl::Status GatherProbs(const GatherProbsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchGatherProbs(a, ctx_, stream_.get()); });
  }
  absl::Status Logprobs(const LogprobsArgs& a) override {
    return Enqueue([&] { return cuda::LaunchLogprobs(a, ctx_, stream_.get()); });
  }

  bool SupportsRecording() const override { return true; }
  absl::Status BeginRecording() override {
    if (recording_) {
      return absl::FailedPreconditionError("BeginRecording: already recording; EndRecording first");
    }
    SPECD_RETURN_IF_ERROR(Use());
    SPECD_RETURN_IF_ERROR(
        CudaStatus(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal),
                   "cudaStreamBeginCapture"));
    recording_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<RecordedWork>> EndRecording() override {
    if (!recording_) {
      return absl::FailedPreconditionError("EndRecording: not recording; BeginRecording first");
    }
    recording_ = false;
    const absl::Status op_failed = std::exchange(recording_error_, absl::OkStatus());
    // The capture ends whatever else failed: the stream must return to normal.
    const absl::Status use = Use();
    cudaGraph_t graph = nullptr;
    const absl::Status ended =
        CudaStatus(cudaStreamEndCapture(stream_.get(), &graph), "cudaStreamEndCapture");
    for (const HeldFree& f : std::exchange(held_frees_, {})) FreeNow(f.data, f.kind);
    absl::Status failed = !use.ok() ? use : ended;
    if (!op_failed.ok()) {
      // The recording misses the failed op's work: replaying it would compute something else.
      failed = absl::Status(op_failed.code(),
                            absl::StrCat("EndRecording: the recording is discarded because an op "
                                         "failed while recording: ",
                                         op_failed.message()));
    }
    if (!failed.ok()) {
      if (graph != nullptr) (void)CudaStatus(cudaGraphDestroy(graph), "cudaGraphDestroy");
      return failed;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) {
      cudaGraphDestroy(graph);
      return CudaStatus(e, "cudaGraphInstantiate");
    }
    return std::make_unique<CudaGraph>(options_.device, graph, exec);
  }
  absl::Status Replay(const RecordedWork& work) override {
    return Enqueue([&]() -> absl::Status {
      const auto* graph = dynamic_cast<const CudaGraph*>(&work);
      if (graph == nullptr) return absl::InvalidArgumentError("Replay: not a CUDA graph");
      return CudaStatus(cudaGraphLaunch(graph->exec(), stream_.get()), "cudaGraphLaunch");
    });
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(int64_t bytes, MemoryKind kind) override {
    if (recording_) return RefusedWhileRecording("Allocate");
    SPECD_RETURN_IF_ERROR(Use());
    void* p = nullptr;
    const cudaError_t e = kind == MemoryKind::kStaging
                              ? cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault)
                              : cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e == cudaSuccess) return p;
    const absl::Status status =
        CudaStatus(e, kind == MemoryKind::kStaging ? "cudaHostAlloc" : "cudaMalloc");
    // Only cudaErrorMemoryAllocation means the memory is not there. The call also returns errors
    // of earlier asynchronous work, such as a sticky illegal address, which no smaller request
    // or freed memory would cure: those stay INTERNAL.
    if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(status.message());
    return status;
  }
  void FreeRaw(void* data, int64_t bytes, MemoryKind kind) override {
    (void)bytes;
    // cudaFree synchronizes, which would invalidate the capture: the memory goes at EndRecording.
    if (recording_) {
      held_frees_.push_back({data, kind});
      return;
    }
    FreeNow(data, kind);
  }

 private:
  struct HeldFree {
    void* data;
    MemoryKind kind;
  };

  void FreeNow(void* data, MemoryKind kind) {
    (void)Use();
    // Nothing to report a failed free to (an earlier sticky error, say), but clear it all the same.
    (void)CudaStatus(kind == MemoryKind::kStaging ? cudaFreeHost(data) : cudaFree(data), "free");
  }

  absl::Status Use() const { return MakeCurrent(options_.device); }

  // Every op, copy and replay is enqueued through here: with this back end's device current,
  // and, while recording, keeping the first failure, so that EndRecording discards a recording
  // that misses work (kernels/backend.h). A refused Synchronize, Download or Allocate (see
  // RefusedWhileRecording) enqueues nothing and leaves the recording as it was.
  template <typename Launch>
  absl::Status Enqueue(const Launch& launch) {
    absl::Status status = Use();
    if (status.ok()) status = launch();
    if (!status.ok() && recording_ && recording_error_.ok()) recording_error_ = status;
    return status;
  }

  absl::Status Copy(std::string_view op, void* dst, const void* src, int64_t bytes,
                    cudaMemcpyKind kind) {
    return Enqueue([&]() -> absl::Status {
      SPECD_RETURN_IF_ERROR(ValidateCopyArgs(ToAbsl(op), dst, src, bytes));
      if (bytes == 0) return absl::OkStatus();
      return CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream_.get()),
                        "cudaMemcpyAsync");
    });
  }

  const CudaBackendOptions options_;
  const std::string name_;
  UniqueStream stream_;
  UniqueHost error_host_;
  cuda::CudaContext ctx_;
  Buffer workspace_;
  // Between BeginRecording and EndRecording: the stream is capturing a CUDA graph.
  bool recording_ = false;
  // The first op, copy or replay that failed while recording, or OK.
  absl::Status recording_error_;
  // Buffers freed while recording, released by EndRecording.
  std::vector<HeldFree> held_frees_;
};

// The loaded driver's CUDA version (e.g. 12080 for 12.8), 0 without a driver.
int DriverCudaVersion() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return version;
}

std::string CudaVersionName(int version) {
  return absl::StrCat(version / 1000, ".", version % 1000 / 10);
}

// Why cudaGetDeviceCount found nothing usable, in words a person can act on.
std::string NoDeviceReason(cudaError_t count) {
  if (count == cudaSuccess) return "the driver reports 0 devices";
  const std::string error = absl::StrCat(cudaGetErrorName(count), ": ", cudaGetErrorString(count));
  const int driver = DriverCudaVersion();
  if (driver == 0) return absl::StrCat(error, "; no NVIDIA driver is loaded");
  if (driver < CUDART_VERSION) {
    return absl::StrCat(error, "; the NVIDIA driver supports CUDA ", CudaVersionName(driver),
                        ", older than the CUDA ", CudaVersionName(CUDART_VERSION),
                        " runtime of this build: update the driver");
  }
  return error;
}

}  // namespace

bool AutoChoosesCuda() {
  int n = 0;
  const cudaError_t count = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (count == cudaSuccess) return n > 0;
  return count != cudaErrorNoDevice && DriverCudaVersion() > 0;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendWithOptions(
    const CudaBackendOptions& options) {
  int n = 0;
  const cudaError_t count = cudaGetDeviceCount(&n);
  if (count != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend cuda: no usable CUDA device (", NoDeviceReason(count), "); use --backend cpu"));
  }
  if (options.device < 0 || options.device >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", n, " present)"));
  }
  SPECD_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  cudaDeviceProp prop;
  SPECD_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties"));
  if (const cudaError_t probe = cuda::ProbeKernelImage(); probe != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("--backend cuda: this build has no kernels for ", prop.name, " (sm_",
                     prop.major, prop.minor, "): ", cudaGetErrorString(probe),
                     "; rebuild with SPECD_CUDA_ARCHITECTURES including it"));
  }
  cudaStream_t raw_stream = nullptr;
  SPECD_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking),
                                   "cudaStreamCreate"));
  UniqueStream stream(raw_stream);
  void* error_raw = nullptr;
  SPECD_RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&error_raw, sizeof(cuda::DeviceError), cudaHostAllocMapped), "cudaHostAlloc"));
  UniqueHost error_host(error_raw);
  *static_cast<cuda::DeviceError*>(error_raw) = cuda::DeviceError();
  void* error_device = nullptr;
  SPECD_RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&error_device, error_raw, 0),
                                   "cudaHostGetDevicePointer"));
  // Programmatic launches only let kernels start early, so where they do not work the back end
  // launches plainly and says so in its name (which the workers log at start).
  std::string launch_note;
  bool programmatic_launch = false;
  if (options.programmatic_launch && prop.major >= 9) {
    const absl::Status probe = cuda::ProbeProgrammaticLaunch(stream.get());
    programmatic_launch = probe.ok();
    if (!probe.ok()) launch_note = absl::StrCat("; plain launches: ", probe.message());
  }
  const std::string name =
      absl::StrCat("cuda-sm", prop.major, prop.minor, " (", prop.name, launch_note, ")");
  auto backend = std::make_unique<CudaBackend>(
      options, name, std::move(stream), std::move(error_host),
      static_cast<cuda::DeviceError*>(error_device), prop.multiProcessorCount, programmatic_launch);
  SPECD_RETURN_IF_ERROR(backend->Init());
  return backend;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  CudaBackendOptions options;
  options.device = device;
  return CreateCudaBackendWithOptions(options);
}

}  // namespace specd::kernels
