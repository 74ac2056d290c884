#include "common/engine/llama_engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/model/resident_weights.h"

namespace specd {
namespace {

// Caps the cache so a typo in a flag is an error rather than an attempt to allocate terabytes.
constexpr int64_t kMaxKvFloats = int64_t{1} << 36;  // 256 GiB of f32

template <typename T>
T* Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaEngine>> LlamaEngine::Create(
    std::unique_ptr<ModelWeights> weights, std::unique_ptr<kernels::Backend> backend,
    const EngineOptions& options) {
  if (weights == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("engine: weights and backend are required");
  }
  const ModelConfig& c = weights->config;
  int64_t max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : c.max_position_embeddings;
  if (max_seq_len <= 0) {
    return absl::InvalidArgumentError("engine: max_seq_len must be positive");
  }
  if (options.kv_block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: kv_block_size must be positive, got ", options.kv_block_size));
  }
  if (options.kv_capacity_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine: kv_capacity_tokens must be positive, got ", options.kv_capacity_tokens));
  }
  const int64_t num_blocks =
      (options.kv_capacity_tokens + options.kv_block_size - 1) / options.kv_block_size;
  const int64_t per_layer = num_blocks * options.kv_block_size * c.kv_dim();
  if (per_layer > kMaxKvFloats / std::max<int64_t>(1, 2 * c.num_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: a KV cache of ", options.kv_capacity_tokens, " tokens needs ",
                     2 * c.num_layers * per_layer * 4 / (1 << 20), " MiB, over the 256 GiB limit"));
  }
  KvPoolConfig kv_config;
  kv_config.num_blocks = num_blocks;
  kv_config.block_size = options.kv_block_size;
  kv_config.max_blocks_per_seq = (max_seq_len + options.kv_block_size - 1) / options.kv_block_size;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<KvPool> kv, KvPool::Create(kv_config));
  auto engine = std::unique_ptr<LlamaEngine>(
      new LlamaEngine(std::move(weights), std::move(backend), std::move(kv), max_seq_len));
  engine->k_cache_.assign(static_cast<size_t>(per_layer * c.num_layers), 0.0f);
  engine->v_cache_.assign(static_cast<size_t>(per_layer * c.num_layers), 0.0f);
  return engine;
}

LlamaEngine::LlamaEngine(std::unique_ptr<ModelWeights> weights,
                         std::unique_ptr<kernels::Backend> backend, std::unique_ptr<KvPool> kv,
                         int64_t max_seq_len)
    : weights_(std::move(weights)),
      backend_(std::move(backend)),
      kv_(std::move(kv)),
      max_seq_len_(max_seq_len),
      inv_freq_(RopeInvFreq(weights_->config)) {}

absl::Status LlamaEngine::Validate(std::span<const SequenceInput> batch) const {
  absl::flat_hash_set<KvPool::SeqId> seen;
  const int64_t vocab = config().vocab_size;
  for (const SequenceInput& in : batch) {
    if (!seen.insert(in.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", in.seq, " appears twice in one forward batch"));
    }
    SPECD_ASSIGN_OR_RETURN(const int64_t cached, kv_->Length(in.seq));
    if (in.start_pos != cached) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", in.seq, ": caller expects ",
                                                        in.start_pos, " cached tokens, worker has ",
                                                        cached));
    }
    if (in.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": no tokens to feed"));
    }
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (cached + n > max_seq_len_) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", in.seq, " would reach ", cached + n,
                                                " tokens, over max_seq_len ", max_seq_len_));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = in.tokens[static_cast<size_t>(i)];
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": token id ", t,
                                                       " at index ", i, " is outside [0, ", vocab,
                                                       ")"));
      }
    }
    int32_t prev = -1;
    for (const int32_t li : in.logit_indices) {
      if (li <= prev || li >= n) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": logit index ", li,
                                                       " must be increasing and below the ", n,
                                                       " fed tokens"));
      }
      prev = li;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardResult> LlamaEngine::Forward(std::span<const SequenceInput> batch) {
  SPECD_RETURN_IF_ERROR(Validate(batch));

  // Reserve KV for the whole batch first; undo on failure so a full pool costs nothing.
  std::vector<int64_t> old_len;
  old_len.reserve(batch.size());
  for (const SequenceInput& in : batch) {
    const absl::Status st =
        kv_->Extend(in.seq, in.start_pos + static_cast<int64_t>(in.tokens.size()));
    if (!st.ok()) {
      for (size_t j = 0; j < old_len.size(); ++j) {
        (void)kv_->Truncate(batch[j].seq, old_len[j]);
      }
      return st;
    }
    old_len.push_back(in.start_pos);
  }
  auto rollback = [&](absl::Status st) {
    for (size_t j = 0; j < batch.size(); ++j) (void)kv_->Truncate(batch[j].seq, old_len[j]);
    return st;
  };

  const ModelConfig& c = config();
  int64_t n_tokens = 0;
  int64_t n_logits = 0;
  for (const SequenceInput& in : batch) {
    n_tokens += static_cast<int64_t>(in.tokens.size());
    n_logits += static_cast<int64_t>(in.logit_indices.size());
  }
  block_table_stride_ = kv_->max_blocks_per_seq();
  int32_t* ids = Grow(s_.ids, n_tokens);
  int32_t* pos = Grow(s_.pos, n_tokens);
  int32_t* token_seq = Grow(s_.token_seq, n_tokens);
  int32_t* tables = Grow(s_.block_tables, static_cast<int64_t>(batch.size()) * block_table_stride_);
  int64_t t = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceInput& in = batch[b];
    SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t>* table, kv_->BlockTable(in.seq));
    std::copy(table->begin(), table->end(), tables + b * block_table_stride_);
    for (size_t i = 0; i < in.tokens.size(); ++i, ++t) {
      ids[t] = in.tokens[i];
      pos[t] = static_cast<int32_t>(in.start_pos + static_cast<int64_t>(i));
      token_seq[t] = static_cast<int32_t>(b);
    }
  }

  float* x = Grow(s_.x, n_tokens * c.hidden_size);
  kernels::EmbeddingArgs emb{weights_->embed, ids, x, n_tokens};
  if (absl::Status st = backend_->Embedding(emb); !st.ok()) return rollback(st);
  if (absl::Status st = RunLayers(n_tokens); !st.ok()) return rollback(st);

  // Final norm and classifier only for the rows asked for.
  float* xr = Grow(s_.h, std::max<int64_t>(n_logits, 1) * c.hidden_size);
  int64_t r = 0;
  t = 0;
  for (const SequenceInput& in : batch) {
    for (const int32_t li : in.logit_indices) {
      std::copy_n(x + (t + li) * c.hidden_size, c.hidden_size, xr + r * c.hidden_size);
      ++r;
    }
    t += static_cast<int64_t>(in.tokens.size());
  }
  ForwardResult result;
  result.vocab_size = c.vocab_size;
  if (n_logits == 0) return result;
  kernels::RmsNormArgs norm{xr,
                            weights_->final_norm.data(),
                            xr,
                            n_logits,
                            c.hidden_size,
                            static_cast<float>(c.rms_norm_eps)};
  if (absl::Status st = backend_->RmsNorm(norm); !st.ok()) return rollback(st);
  result.logits.resize(static_cast<size_t>(n_logits * c.vocab_size));
  kernels::MatmulArgs head{xr, weights_->lm_head, result.logits.data(), n_logits};
  if (absl::Status st = backend_->Matmul(head); !st.ok()) return rollback(st);
  return result;
}

absl::Status LlamaEngine::RunLayers(int64_t n) {
  const ModelConfig& c = config();
  const int64_t dim = c.hidden_size;
  float* x = s_.x.data();
  float* h = Grow(s_.h, n * dim);
  float* q = Grow(s_.q, n * c.q_dim());
  float* k = Grow(s_.k, n * c.kv_dim());
  float* v = Grow(s_.v, n * c.kv_dim());
  float* att = Grow(s_.att, n * c.q_dim());
  float* gate = Grow(s_.gate, n * c.intermediate_size);
  float* up = Grow(s_.up, n * c.intermediate_size);
  const int64_t layer_floats = kv_->total_blocks() * kv_->block_size() * c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  kernels::Backend& be = *backend_;

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_->layers[static_cast<size_t>(l)];
    kernels::PagedKv cache{k_cache_.data() + l * layer_floats,
                           v_cache_.data() + l * layer_floats,
                           s_.block_tables.data(),
                           block_table_stride_,
                           kv_->block_size(),
                           c.kv_dim()};
    // attn_norm -> q/k/v -> rope -> store -> attention -> o_proj -> residual
    SPECD_RETURN_IF_ERROR(be.RmsNorm({x, w.attn_norm.data(), h, n, dim, eps}));
    SPECD_RETURN_IF_ERROR(be.Matmul({h, w.wq, q, n}));
    SPECD_RETURN_IF_ERROR(be.Matmul({h, w.wk, k, n}));
    SPECD_RETURN_IF_ERROR(be.Matmul({h, w.wv, v, n}));
    SPECD_RETURN_IF_ERROR(
        be.Rope({q, s_.pos.data(), inv_freq_.data(), n, c.num_heads, c.head_dim}));
    SPECD_RETURN_IF_ERROR(
        be.Rope({k, s_.pos.data(), inv_freq_.data(), n, c.num_kv_heads, c.head_dim}));
    SPECD_RETURN_IF_ERROR(be.StoreKv({k, v, cache, s_.token_seq.data(), s_.pos.data(), n}));
    kernels::AttentionArgs a;
    a.q = q;
    a.out = att;
    a.cache = cache;
    a.token_seq = s_.token_seq.data();
    a.pos = s_.pos.data();
    a.n_tokens = n;
    a.n_heads = c.num_heads;
    a.n_kv_heads = c.num_kv_heads;
    a.head_dim = c.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    SPECD_RETURN_IF_ERROR(be.Attention(a));
    SPECD_RETURN_IF_ERROR(be.Matmul({att, w.wo, h, n}));  // attn_out
    SPECD_RETURN_IF_ERROR(be.Add({x, h, n, dim}));
    // ffn_norm -> gate/up -> swiglu -> down -> residual
    SPECD_RETURN_IF_ERROR(be.RmsNorm({x, w.ffn_norm.data(), h, n, dim, eps}));
    SPECD_RETURN_IF_ERROR(be.Matmul({h, w.w_gate, gate, n}));
    SPECD_RETURN_IF_ERROR(be.Matmul({h, w.w_up, up, n}));
    SPECD_RETURN_IF_ERROR(be.SwiGlu({gate, up, gate, n, c.intermediate_size}));
    SPECD_RETURN_IF_ERROR(be.Matmul({gate, w.w_down, h, n}));  // ffn_out
    SPECD_RETURN_IF_ERROR(be.Add({x, h, n, dim}));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateCpuEngine(const std::filesystem::path& dir,
                                                             int num_threads,
                                                             const EngineOptions& options,
                                                             const LoadOptions& load) {
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModelWeights(dir, load));
  // The CPU back end streams weights from host memory; huge pages make that much faster.
  SPECD_RETURN_IF_ERROR(MakeWeightsResident(weights.get()));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                         kernels::CreateCpuBackend(num_threads));
  return LlamaEngine::Create(std::move(weights), std::move(backend), options);
}

}  // namespace specd
