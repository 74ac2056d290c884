// libFuzzer target: ParseModelConfig must never crash; an accepted config must survive the
// ModelConfigToJson round trip and give RoPE frequencies of the right size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/config.h"
#include "tests/fuzz/fuzz_util.h"

using specd::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<specd::ModelConfig> config = specd::ParseModelConfig(text);
  if (!config.ok()) {
    Check(config.status().message().find("config.json") == 0);
    return 0;
  }
  const specd::ModelConfig& c = *config;
  Check(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0);
  Check(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0);
  Check(c.head_dim > 0 && c.head_dim % 2 == 0);

  const absl::StatusOr<specd::ModelConfig> back =
      specd::ParseModelConfig(specd::ModelConfigToJson(c));
  Check(back.ok());
  Check(back->vocab_size == c.vocab_size && back->hidden_size == c.hidden_size &&
        back->intermediate_size == c.intermediate_size && back->num_layers == c.num_layers &&
        back->num_heads == c.num_heads && back->num_kv_heads == c.num_kv_heads &&
        back->head_dim == c.head_dim && back->rms_norm_eps == c.rms_norm_eps &&
        back->rope_theta == c.rope_theta && back->rope_scaling.type == c.rope_scaling.type &&
        back->bos_token_ids == c.bos_token_ids && back->eos_token_ids == c.eos_token_ids &&
        back->tie_word_embeddings == c.tie_word_embeddings && back->torch_dtype == c.torch_dtype);

  const std::vector<float> inv_freq = specd::RopeInvFreq(c);
  Check(inv_freq.size() == static_cast<size_t>(c.head_dim / 2));
  return 0;
}
