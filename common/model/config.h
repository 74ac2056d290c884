// Llama-family model configuration, as read from a Hugging Face `config.json`.
#ifndef SPECD_COMMON_MODEL_CONFIG_H_
#define SPECD_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace specd {

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads when config.json omits it
  int64_t head_dim = 0;      // explicit `head_dim`, else hidden_size / num_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  std::vector<int32_t> bos_token_ids;  // usually one
  std::vector<int32_t> eos_token_ids;  // Llama 3 lists several
  kernels::DType torch_dtype = kernels::DType::kF32;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses and validates config.json text. Every missing or inconsistent field is an
// INVALID_ARGUMENT that names the field (e.g. "config.json: num_attention_heads (7) must divide
// hidden_size (64) when head_dim is absent").
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);

// Reads `dir/config.json`. NOT_FOUND if absent.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& dir);

// The Hugging Face config.json that `ParseModelConfig` reads back to an equal config; used by the
// converter and synthetic-model writer.
std::string ModelConfigToJson(const ModelConfig& config);

// Per-pair inverse frequencies [head_dim / 2] for RoPE, with llama3 scaling applied, computed in
// f32 as Hugging Face transformers does (`_compute_llama3_parameters`).
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_CONFIG_H_
