// Synthetic Llama checkpoints: random weights of any shape in the Hugging Face directory format,
// with a knob for how far an early-exit draft agrees with its target.
//
// Plain random weights make a draft and its target disagree almost always. Agreement becomes
// controllable when the embedding dominates the residual stream (embedding std ~ 1) and the
// attention and MLP output projections are scaled by `residual_scale` s: each layer then nudges
// the stream by O(s), so the first L layers (an early-exit draft) predict what all layers predict
// with a probability that falls as s grows. The classifier is untied so the model does not just
// echo its input token.
#ifndef SPECD_COMMON_SYNTH_SYNTH_H_
#define SPECD_COMMON_SYNTH_SYNTH_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/tokenizer/llama2c_import.h"

namespace specd {

struct SynthSpec {
  ModelConfig config;
  kernels::DType dtype = kernels::DType::kF32;
  uint64_t seed = 1;
  double residual_scale = 0.1;  // s: scale of o_proj and down_proj
  double embed_std = 1.0;
  // Writes model.safetensors.index.json with this many shards when > 1 (exercises sharded loading).
  int num_shards = 1;
};

// Named shapes: tiny, stories15M, stories42M, stories110M, llama-3.2-1b, llama-3.2-3b.
absl::StatusOr<ModelConfig> ShapePreset(std::string_view name);
std::vector<std::string> ShapePresetNames();

using SynthProgress = std::function<void(int64_t done, int64_t total)>;

// Vocabularies from this size up get a synthetic tokenizer (3 special + 256 byte tokens + merges).
inline constexpr int64_t kMinTokenizerVocab = 259;

// Writes config.json, model.safetensors (or shards + index), generation_config.json and, when
// vocab_size >= kMinTokenizerVocab, a synthetic SentencePiece-style tokenizer (tokenizer.json +
// tokenizer_config.json) to `out_dir`.
absl::Status WriteSyntheticModel(const SynthSpec& spec, const std::filesystem::path& out_dir,
                                 const SynthProgress& progress = {});

// Writes a draft that keeps the first `layers` layers of the checkpoint in `target_dir`, with its
// embedding, final norm and classifier, plus the target's tokenizer files.
absl::Status WriteEarlyExitDraft(const std::filesystem::path& target_dir, int64_t layers,
                                 const std::filesystem::path& out_dir,
                                 const SynthProgress& progress = {});

// Tokenizer files for `vocab_size` ids (>= kMinTokenizerVocab): <unk>, <s>, </s>, 256 byte
// tokens, then pieces built by deterministic merges of printable characters.
absl::StatusOr<HfTokenizerFiles> SyntheticTokenizer(int64_t vocab_size);

}  // namespace specd

#endif  // SPECD_COMMON_SYNTH_SYNTH_H_
