// The host side of the CUDA emulator: the part of the CUDA runtime API that kernels/cuda/ calls,
// over host memory and emulated_device.h's launches, so that the CUDA back end itself
// (cuda_backend.cc), not a stand-in, runs in CI where no GPU is.
//
// One emulated device. Device memory is host memory (cudaMalloc, cudaHostAlloc and mapped
// pointers are plain aligned allocations). Work on a stream runs when it is enqueued, so every
// stream is always idle, except while it captures a graph: then launches, copies and memsets are
// recorded, with their parameters as they were at capture, and run again by each cudaGraphLaunch.
// As on a GPU, synchronizing or querying a capturing stream fails and invalidates the capture, and
// cudaStreamEndCapture then reports it.
//
// The functions are C++ inlines in the global namespace, not the runtime's C symbols, so a binary
// may hold both this and the real CUDA back end.
#ifndef SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_RUNTIME_H_
#define SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tests/kernels/cuda_emulation/emulated_device.h"

// The names, types and signatures are CUDA's own, which the code under test calls.
// NOLINTBEGIN(bugprone-reserved-identifier,google-runtime-int,google-global-names-in-headers,readability-identifier-naming,bugprone-macro-parentheses,readability-inconsistent-declaration-parameter-name)
#define CUDART_VERSION 13000

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaErrorAssert = 710,
  cudaErrorECCUncorrectable = 214,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorIllegalState = 401,
};

enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostAllocDefault = 0;
constexpr unsigned cudaHostAllocMapped = 2;

struct CUgraph_st;
struct CUgraphExec_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;

struct cudaDeviceProp {
  char name[256];
  int major;
  int minor;
  int multiProcessorCount;
};
struct cudaFuncAttributes {
  int maxThreadsPerBlock;
};

namespace emu {

// The emulated device's properties: an sm_90 part with 132 SMs and 16 GiB.
constexpr int kSmCount = 132;
constexpr int64_t kDeviceBytes = int64_t{16} << 30;

cudaError_t GetLastError();
cudaError_t PeekAtLastError();
const char* ErrorName(cudaError_t error);
const char* ErrorString(cudaError_t error);
cudaError_t Malloc(void** p, size_t bytes);
cudaError_t Free(void* p);
cudaError_t MemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t StreamCreate(cudaStream_t* stream);
cudaError_t StreamDestroy(cudaStream_t stream);
cudaError_t StreamSynchronize(cudaStream_t stream);
cudaError_t StreamQuery(cudaStream_t stream);
cudaError_t StreamBeginCapture(cudaStream_t stream);
cudaError_t StreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t GraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph);
cudaError_t GraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t GraphDestroy(cudaGraph_t graph);
cudaError_t GraphExecDestroy(cudaGraphExec_t exec);
cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream);
cudaError_t MemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream);
// Runs `work` on `stream` now, or records it while the stream captures a graph (a null stream
// runs it now).
void Enqueue(cudaStream_t stream, std::function<void()> work);
// Records `error` as the thread's last error (which cudaGetLastError returns and clears) and
// returns it.
cudaError_t SetError(cudaError_t error);

}  // namespace emu

inline cudaError_t cudaGetLastError() { return emu::GetLastError(); }
inline cudaError_t cudaPeekAtLastError() { return emu::PeekAtLastError(); }
inline const char* cudaGetErrorName(cudaError_t e) { return emu::ErrorName(e); }
inline const char* cudaGetErrorString(cudaError_t e) { return emu::ErrorString(e); }

inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : emu::SetError(cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return emu::SetError(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{"emulated CUDA device", 9, 0, emu::kSmCount};
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Kernel /*kernel*/) {
  attributes->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

inline cudaError_t cudaMalloc(void** p, size_t bytes) { return emu::Malloc(p, bytes); }
inline cudaError_t cudaFree(void* p) { return emu::Free(p); }
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned /*flags*/) {
  return emu::Malloc(p, bytes);
}
inline cudaError_t cudaFreeHost(void* p) { return emu::Free(p); }
inline cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned /*flags*/) {
  *device = host;
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  return emu::MemGetInfo(free_bytes, total_bytes);
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned /*flags*/) {
  return emu::StreamCreate(stream);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) { return emu::StreamDestroy(stream); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return emu::StreamSynchronize(stream);
}
inline cudaError_t cudaStreamQuery(cudaStream_t stream) { return emu::StreamQuery(stream); }
inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode /*mode*/) {
  return emu::StreamBeginCapture(stream);
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  return emu::StreamEndCapture(stream, graph);
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                        unsigned long long /*flags*/) {
  return emu::GraphInstantiate(exec, graph);
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  return emu::GraphLaunch(exec, stream);
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return emu::GraphDestroy(graph); }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return emu::GraphExecDestroy(exec);
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                                   cudaMemcpyKind /*kind*/, cudaStream_t stream) {
  return emu::MemcpyAsync(dst, src, bytes, stream);
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  return emu::MemsetAsync(p, value, bytes, stream);
}

// Launches with attributes. The one attribute kernels/cuda/ sets, programmatic stream
// serialization, only lets a GPU start a kernel early; its kernels then wait for their
// predecessor before touching memory, which is the order the emulator runs them in anyway.
enum cudaLaunchAttributeID : int {
  cudaLaunchAttributeIgnore = 0,
  cudaLaunchAttributeProgrammaticStreamSerialization = 6,
};
union cudaLaunchAttributeValue {
  unsigned char pad[64];
  unsigned int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned int numAttrs;
};
// The parameters are converted and copied at the launch, as a launch copies them (a CUDA graph
// replays the values captured then); invalid configurations become the thread's last error.
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...),
                               Args&&... args) {
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  emu::Launch(config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream,
              [kernel, params] { std::apply(kernel, params); });
  return cudaSuccess;
}

// NOLINTEND(bugprone-reserved-identifier,google-runtime-int,google-global-names-in-headers,readability-identifier-naming,bugprone-macro-parentheses,readability-inconsistent-declaration-parameter-name)

#endif  // SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_RUNTIME_H_
