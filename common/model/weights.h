// Llama weights bound to tensors of a mapped checkpoint, checked against the config. They live in
// host memory; the engine uploads them to its back end (common/engine/device_weights.h).
#ifndef SPECD_COMMON_MODEL_WEIGHTS_H_
#define SPECD_COMMON_MODEL_WEIGHTS_H_

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "kernels/backend.h"

namespace specd {

struct LayerWeights {
  kernels::WeightView wq;        // [q_dim, hidden]
  kernels::WeightView wk;        // [kv_dim, hidden]
  kernels::WeightView wv;        // [kv_dim, hidden]
  kernels::WeightView wo;        // [hidden, q_dim]
  kernels::WeightView w_gate;    // [intermediate, hidden]
  kernels::WeightView w_up;      // [intermediate, hidden]
  kernels::WeightView w_down;    // [hidden, intermediate]
  std::vector<float> attn_norm;  // [hidden], converted to f32 at load (tiny)
  std::vector<float> ffn_norm;   // [hidden]
};

struct ModelWeights {
  ModelConfig config;                 // num_layers reflects exit_layer when set
  kernels::WeightView embed;          // [vocab, hidden]
  kernels::WeightView lm_head;        // [vocab, hidden]; == embed when tied; [N, hidden] when
                                      // LoadOptions::output_vocab keeps N tokens
  std::vector<int32_t> output_vocab;  // the tokens lm_head's rows score; empty = all, in order
  std::vector<float> final_norm;      // [hidden]
  std::vector<LayerWeights> layers;
  std::unique_ptr<Checkpoint> checkpoint;  // owns the mapped memory the views point into
  std::vector<char> lm_head_rows;          // the kept rows of a reduced classifier

  ModelWeights();
  ~ModelWeights();
};

struct LoadOptions {
  // Keep only the first `exit_layer` layers (early-exit self-speculation draft); 0 keeps all.
  int64_t exit_layer = 0;
  // Called with (tensors bound so far, total) while loading; may be empty.
  std::function<void(int64_t, int64_t)> progress;
  // Keep only these classifier rows (a draft's reduced head, FR-Spec): strictly ascending token
  // ids inside the vocabulary. Empty keeps every row.
  std::vector<int32_t> output_vocab;
};

// Loads `dir` (config.json + model.safetensors or model.safetensors.index.json). Every tensor's
// dtype and shape are checked; errors name the file and tensor.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::filesystem::path& dir,
                                                               const LoadOptions& options = {});

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_WEIGHTS_H_
