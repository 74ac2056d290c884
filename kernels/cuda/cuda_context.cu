#include "kernels/cuda/cuda_context.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"

namespace specd::kernels::cuda {
namespace {

constexpr std::array<const char*, 12> kOpNames = {
    "?",          "Embedding",     "Rope",        "StoreKv",    "Attention",   "GatherRows",
    "CopyKvRows", "CombineLogits", "ProcessRows", "SampleRows", "GatherProbs", "Logprobs"};
constexpr std::array<const char*, 24> kFieldNames = {"ids",
                                                     "pos",
                                                     "token_seq",
                                                     "slot",
                                                     "cache.block_tables",
                                                     "rows",
                                                     "src_rows",
                                                     "dst_rows",
                                                     "cond_rows",
                                                     "uncond_rows",
                                                     "rows.prob_slot",
                                                     "rows.mode",
                                                     "rows.params",
                                                     "rows history range",
                                                     "draws.prob_slot",
                                                     "slots",
                                                     "tokens",
                                                     "query_rows",
                                                     "query_tokens",
                                                     "mask_start",
                                                     "tree_mask",
                                                     "rows.prob_slot",
                                                     "scale",
                                                     "rows logit bias"};

// A kernel that does nothing, to learn whether this build has code the device can run.
__global__ void ProbeKernel() { AfterPreviousKernel(); }

// The programmatic-launch probe's pair, one warp each: the second reads what the first wrote.
__global__ void ProbeWrite(int* p, int value) {
  AfterPreviousKernel();
  if (threadIdx.x == 0) *p = value;
}
__global__ void ProbeCopy(const int* from, int* to) {
  AfterPreviousKernel();
  if (threadIdx.x == 0) *to = *from;
}

// Runs the pair as programmatic launches, eagerly or recorded in a CUDA graph and replayed, and
// reads back what the second kernel copied.
absl::Status RunProbePair(cudaStream_t stream, int* pair, int value, bool record) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (record) {
    SPECD_RETURN_IF_ERROR(
        CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                   "cudaStreamBeginCapture"));
  }
  LaunchKernel(ProbeWrite, 1, kWarp, 0, stream, true, pair, value);
  LaunchKernel(ProbeCopy, 1, kWarp, 0, stream, true, static_cast<const int*>(pair), pair + 1);
  const cudaError_t launched = cudaGetLastError();
  if (record) {
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    absl::Status st = CudaStatus(launched != cudaSuccess ? launched : ended, "capturing a launch");
    if (st.ok()) {
      st.Update(CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
    }
    if (st.ok()) st.Update(CudaStatus(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"));
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    SPECD_RETURN_IF_ERROR(st);
  } else {
    SPECD_RETURN_IF_ERROR(CudaStatus(launched, "a launch"));
  }
  int copied = 0;
  SPECD_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(&copied, pair + 1, sizeof copied, cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync"));
  SPECD_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (copied != value) {
    return absl::InternalError(absl::StrCat("the second kernel read ", copied, ", not ", value));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DeviceErrorMessage(const DeviceError& e) {
  const char* op = e.op >= 0 && e.op < static_cast<int32_t>(kOpNames.size()) ? kOpNames[e.op] : "?";
  const char* field = e.field >= 0 && e.field < static_cast<int32_t>(kFieldNames.size())
                          ? kFieldNames[e.field]
                          : "?";
  switch (static_cast<DeviceField>(e.field)) {
    case DeviceField::kMaskStart:
      return absl::StrCat(op, ": mask_start[", e.index,
                          "] = ", static_cast<int32_t>(static_cast<uint32_t>(e.value)),
                          " must be in [slot - 63, slot] (slot[", e.index, "] = ", e.value >> 32,
                          "); the kernel skipped it");
    case DeviceField::kTreeMask:
      return absl::StrCat(op, ": tree_mask[", e.index,
                          "] must let the token see its own slot (bit ", e.value,
                          "); the kernel skipped it");
    case DeviceField::kRepeatedProbSlot:
      return absl::StrCat(op, ": rows[", e.index, "].prob_slot = ", e.value,
                          " is an earlier row's slot too; each row needs its own; the kernel "
                          "skipped it");
    case DeviceField::kHistoryRange:
      return absl::StrCat(op, ": rows[", e.index,
                          "] names history outside [0, history_len = ", e.value,
                          "); the kernel skipped it");
    case DeviceField::kScale:
      return absl::StrCat(op, ": scale[", e.index, "] must be finite; the kernel skipped it");
    case DeviceField::kBias:
      return absl::StrCat(op, ": rows[", e.index,
                          "] names logit biases outside [0, n_biases = ", e.value,
                          "), or ones not ascending, in the vocabulary and finite; the kernel "
                          "skipped it");
    default:
      return absl::StrCat(op, ": ", field, " at index ", e.index, " is out of range (value ",
                          e.value, "); the kernel skipped it");
  }
}

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error)));
}

bool IsStickyError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

cudaError_t ProbeKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, ProbeKernel);
}

absl::Status ProbeProgrammaticLaunch(cudaStream_t stream) {
  void* pair = nullptr;
  SPECD_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&pair, 2 * sizeof(int)), "cudaMalloc"));
  absl::Status st = RunProbePair(stream, static_cast<int*>(pair), 7, /*record=*/false);
  if (st.ok()) st.Update(RunProbePair(stream, static_cast<int*>(pair), 11, /*record=*/true));
  (void)cudaFree(pair);
  return st;
}

}  // namespace specd::kernels::cuda
