// A model's weights in its back end's memory: every matrix in one buffer, the small f32 vectors
// (norm weights, RoPE inverse frequencies) in another. On the CPU this is the huge-page copy that
// decode streams from; on a GPU it is device memory.
#ifndef SPECD_COMMON_ENGINE_DEVICE_WEIGHTS_H_
#define SPECD_COMMON_ENGINE_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/weights.h"
#include "kernels/backend.h"

namespace specd {

struct DeviceLayerWeights {
  kernels::WeightView wq, wk, wv, wo, w_gate, w_up, w_down;
  const float* attn_norm = nullptr;  // [hidden]
  const float* ffn_norm = nullptr;   // [hidden]
};

struct DeviceWeights {
  kernels::WeightView embed;
  kernels::WeightView lm_head;  // the embedding's memory when tied
  const float* final_norm = nullptr;
  const float* inv_freq = nullptr;  // [head_dim / 2], RoPE with the config's scaling
  std::vector<DeviceLayerWeights> layers;
  kernels::Buffer matrices;
  kernels::Buffer vectors;
};

// Copies `host` into `backend`'s memory (a tied classifier once) and synchronizes.
// `progress(bytes_done, bytes_total)` is called as matrices go up; it may be empty.
absl::StatusOr<DeviceWeights> UploadWeights(const ModelWeights& host, kernels::Backend& backend,
                                            const std::function<void(int64_t, int64_t)>& progress);

}  // namespace specd

#endif  // SPECD_COMMON_ENGINE_DEVICE_WEIGHTS_H_
