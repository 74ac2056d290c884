#include "tests/kernels/cuda_emulation/emulated_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

using Work = std::vector<std::function<void()>>;

struct CUstream_st {
  bool capturing = false;
  // A call the capture cannot hold (a synchronize, a query) happened: EndCapture fails.
  bool invalidated = false;
  Work captured;
};
struct CUgraph_st {
  Work work;
};
struct CUgraphExec_st {
  Work work;
};

namespace emu {
namespace {

constexpr size_t kAlignment = 256;  // as cudaMalloc's

thread_local cudaError_t last_error = cudaSuccess;

struct Allocations {
  std::mutex mutex;
  std::unordered_map<void*, size_t> bytes;
  int64_t in_use = 0;
};
Allocations& Allocated() {
  static Allocations allocations;
  return allocations;
}

}  // namespace

cudaError_t SetError(cudaError_t error) {
  last_error = error;
  return error;
}

cudaError_t GetLastError() { return std::exchange(last_error, cudaSuccess); }

cudaError_t PeekAtLastError() { return last_error; }

namespace {

struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;
};
// The errors the emulator returns, in the runtime's words.
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation is not permitted now"},
};

const ErrorText* FindError(cudaError_t error) {
  for (const ErrorText& e : kErrors) {
    if (e.error == error) return &e;
  }
  return nullptr;
}

}  // namespace

const char* ErrorName(cudaError_t error) {
  const ErrorText* e = FindError(error);
  return e != nullptr ? e->name : "cudaErrorUnknown";
}

const char* ErrorString(cudaError_t error) {
  const ErrorText* e = FindError(error);
  return e != nullptr ? e->text : "an error the CUDA emulator does not name";
}

cudaError_t Malloc(void** p, size_t bytes) {
  Allocations& a = Allocated();
  const std::lock_guard<std::mutex> lock(a.mutex);
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (a.in_use + static_cast<int64_t>(rounded) > kDeviceBytes) {
    *p = nullptr;
    return SetError(cudaErrorMemoryAllocation);
  }
  *p = std::aligned_alloc(kAlignment, std::max(rounded, kAlignment));
  if (*p == nullptr) return SetError(cudaErrorMemoryAllocation);
  a.bytes[*p] = rounded;
  a.in_use += static_cast<int64_t>(rounded);
  return cudaSuccess;
}

cudaError_t Free(void* p) {
  if (p == nullptr) return cudaSuccess;
  Allocations& a = Allocated();
  const std::lock_guard<std::mutex> lock(a.mutex);
  const auto it = a.bytes.find(p);
  if (it == a.bytes.end()) return SetError(cudaErrorInvalidValue);
  a.in_use -= static_cast<int64_t>(it->second);
  a.bytes.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t MemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Allocations& a = Allocated();
  const std::lock_guard<std::mutex> lock(a.mutex);
  *total_bytes = static_cast<size_t>(kDeviceBytes);
  *free_bytes = static_cast<size_t>(kDeviceBytes - a.in_use);
  return cudaSuccess;
}

cudaError_t StreamCreate(cudaStream_t* stream) {
  *stream = std::make_unique<CUstream_st>().release();
  return cudaSuccess;
}

cudaError_t StreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return SetError(cudaErrorInvalidResourceHandle);
  std::unique_ptr<CUstream_st> owned(stream);
  return cudaSuccess;
}

// Work runs when enqueued, so an idle stream has nothing left to wait for; a capturing one
// refuses, and the capture is lost.
cudaError_t StreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr && stream->capturing) {
    stream->invalidated = true;
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}

cudaError_t StreamQuery(cudaStream_t stream) { return StreamSynchronize(stream); }

cudaError_t StreamBeginCapture(cudaStream_t stream) {
  if (stream == nullptr || stream->capturing) return SetError(cudaErrorIllegalState);
  stream->capturing = true;
  stream->invalidated = false;
  stream->captured.clear();
  return cudaSuccess;
}

cudaError_t StreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  *graph = nullptr;
  if (stream == nullptr || !stream->capturing) return SetError(cudaErrorIllegalState);
  stream->capturing = false;
  Work work = std::exchange(stream->captured, {});
  if (stream->invalidated) return SetError(cudaErrorStreamCaptureInvalidated);
  *graph = std::make_unique<CUgraph_st>(CUgraph_st{std::move(work)}).release();
  return cudaSuccess;
}

cudaError_t GraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph) {
  if (graph == nullptr) return SetError(cudaErrorInvalidValue);
  *exec = std::make_unique<CUgraphExec_st>(CUgraphExec_st{graph->work}).release();
  return cudaSuccess;
}

cudaError_t GraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return SetError(cudaErrorInvalidValue);
  for (const std::function<void()>& work : exec->work) Enqueue(stream, work);
  return cudaSuccess;
}

cudaError_t GraphDestroy(cudaGraph_t graph) {
  std::unique_ptr<CUgraph_st> owned(graph);
  return cudaSuccess;
}

cudaError_t GraphExecDestroy(cudaGraphExec_t exec) {
  std::unique_ptr<CUgraphExec_st> owned(exec);
  return cudaSuccess;
}

cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  Enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t MemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  Enqueue(stream, [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  if (stream != nullptr && stream->capturing) {
    stream->captured.push_back(std::move(work));
    return;
  }
  work();
}

}  // namespace emu
