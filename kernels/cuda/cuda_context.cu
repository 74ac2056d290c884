#include "kernels/cuda/cuda_context.h"

#include <array>

#include "absl/strings/str_cat.h"

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
__global__ void ProbeKernel() {}

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

}  // namespace specd::kernels::cuda
