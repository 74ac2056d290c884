#include "common/model/weights.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace specd {
namespace {

// Binds Hugging Face tensor names to views, checking each against the config.
class Binder {
 public:
  Binder(const Checkpoint& checkpoint, const LoadOptions& options, int64_t total)
      : checkpoint_(checkpoint), progress_(options.progress), total_(total) {}

  // A [rows, cols] matrix; `expected` explains the shape in config.json terms.
  absl::StatusOr<kernels::WeightView> Matrix(const std::string& name, int64_t rows, int64_t cols,
                                             absl::string_view expected) {
    SPECD_ASSIGN_OR_RETURN(const TensorView t, Lookup(name, {rows, cols}, expected));
    return kernels::WeightView{t.data, t.dtype, rows, cols};
  }

  // A [dim] vector, converted to f32.
  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t dim,
                                            absl::string_view expected) {
    SPECD_ASSIGN_OR_RETURN(const TensorView t, Lookup(name, {dim}, expected));
    std::vector<float> out(static_cast<size_t>(dim));
    for (int64_t i = 0; i < dim; ++i)
      out[static_cast<size_t>(i)] = kernels::LoadAsF32(t.data, t.dtype, i);
    return out;
  }

 private:
  absl::StatusOr<TensorView> Lookup(const std::string& name, const std::vector<int64_t>& shape,
                                    absl::string_view expected) {
    SPECD_ASSIGN_OR_RETURN(TensorView t, checkpoint_.Get(name));
    if (t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          checkpoint_.FileOf(name), ": tensor ", name, " has shape [", absl::StrJoin(t.shape, ", "),
          "] but config.json implies [", absl::StrJoin(shape, ", "), "] (", expected, ")"));
    }
    ++done_;
    if (progress_) progress_(done_, total_);
    return t;
  }

  const Checkpoint& checkpoint_;
  const std::function<void(int64_t, int64_t)>& progress_;
  const int64_t total_;
  int64_t done_ = 0;
};

}  // namespace

ModelWeights::ModelWeights() = default;
ModelWeights::~ModelWeights() = default;

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::filesystem::path& dir,
                                                               const LoadOptions& options) {
  SPECD_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  if (options.exit_layer < 0 || options.exit_layer > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exit_layer (", options.exit_layer, ") must be in [1, ", config.num_layers,
        "] (num_hidden_layers of ", (dir / "config.json").string(), "), or 0 for all layers"));
  }
  if (options.exit_layer > 0) config.num_layers = options.exit_layer;

  auto weights = std::make_unique<ModelWeights>();
  SPECD_ASSIGN_OR_RETURN(weights->checkpoint, Checkpoint::Open(dir));
  const ModelConfig& c = config;
  const int64_t total = 2 + 9 * c.num_layers + (c.tie_word_embeddings ? 0 : 1);
  Binder bind(*weights->checkpoint, options, total);

  SPECD_ASSIGN_OR_RETURN(weights->embed, bind.Matrix("model.embed_tokens.weight", c.vocab_size,
                                                     c.hidden_size, "vocab_size, hidden_size"));
  // Grown layer by layer, so a config claiming a million layers fails at the first missing tensor
  // instead of allocating for all of them.
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = weights->layers.emplace_back();
    const std::string attn = absl::StrCat("model.layers.", i, ".self_attn.");
    const std::string mlp = absl::StrCat("model.layers.", i, ".mlp.");
    const std::string layer = absl::StrCat("model.layers.", i, ".");
    constexpr absl::string_view kQ = "num_attention_heads * head_dim, hidden_size";
    constexpr absl::string_view kKv = "num_key_value_heads * head_dim, hidden_size";
    SPECD_ASSIGN_OR_RETURN(l.wq, bind.Matrix(attn + "q_proj.weight", c.q_dim(), c.hidden_size, kQ));
    SPECD_ASSIGN_OR_RETURN(l.wk,
                           bind.Matrix(attn + "k_proj.weight", c.kv_dim(), c.hidden_size, kKv));
    SPECD_ASSIGN_OR_RETURN(l.wv,
                           bind.Matrix(attn + "v_proj.weight", c.kv_dim(), c.hidden_size, kKv));
    SPECD_ASSIGN_OR_RETURN(l.wo, bind.Matrix(attn + "o_proj.weight", c.hidden_size, c.q_dim(),
                                             "hidden_size, num_attention_heads * head_dim"));
    SPECD_ASSIGN_OR_RETURN(l.w_gate, bind.Matrix(mlp + "gate_proj.weight", c.intermediate_size,
                                                 c.hidden_size, "intermediate_size, hidden_size"));
    SPECD_ASSIGN_OR_RETURN(l.w_up, bind.Matrix(mlp + "up_proj.weight", c.intermediate_size,
                                               c.hidden_size, "intermediate_size, hidden_size"));
    SPECD_ASSIGN_OR_RETURN(l.w_down,
                           bind.Matrix(mlp + "down_proj.weight", c.hidden_size, c.intermediate_size,
                                       "hidden_size, intermediate_size"));
    SPECD_ASSIGN_OR_RETURN(
        l.attn_norm, bind.Vector(layer + "input_layernorm.weight", c.hidden_size, "hidden_size"));
    SPECD_ASSIGN_OR_RETURN(l.ffn_norm, bind.Vector(layer + "post_attention_layernorm.weight",
                                                   c.hidden_size, "hidden_size"));
  }
  SPECD_ASSIGN_OR_RETURN(weights->final_norm,
                         bind.Vector("model.norm.weight", c.hidden_size, "hidden_size"));
  if (c.tie_word_embeddings) {
    // As transformers does when tying, the embedding is the classifier and a stored
    // lm_head.weight is ignored.
    weights->lm_head = weights->embed;
  } else {
    SPECD_ASSIGN_OR_RETURN(weights->lm_head, bind.Matrix("lm_head.weight", c.vocab_size,
                                                         c.hidden_size, "vocab_size, hidden_size"));
  }
  if (!options.output_vocab.empty()) {
    const std::vector<int32_t>& ids = options.output_vocab;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= c.vocab_size || (i > 0 && ids[i] <= ids[i - 1])) {
        return absl::InvalidArgumentError(
            absl::StrCat("output vocabulary: token ", ids[i], " at index ", i,
                         " must be inside [0, ", c.vocab_size, ") and above the one before it"));
      }
    }
    // The kept rows, copied out of the mapping in their checkpoint dtype.
    const kernels::WeightView full = weights->lm_head;
    const int64_t row_bytes = full.cols * kernels::DTypeSize(full.dtype);
    weights->lm_head_rows.resize(ids.size() * static_cast<size_t>(row_bytes));
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(weights->lm_head_rows.data() + i * static_cast<size_t>(row_bytes),
                  static_cast<const char*>(full.data) + ids[i] * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
    weights->lm_head = kernels::WeightView{weights->lm_head_rows.data(), full.dtype,
                                           static_cast<int64_t>(ids.size()), full.cols};
    weights->output_vocab = ids;
  }
  weights->config = std::move(config);
  return weights;
}

}  // namespace specd
