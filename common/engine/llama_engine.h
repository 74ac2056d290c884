// The Llama forward pass over a varlen batch with a paged KV cache. One code path serves prefill,
// one-token decode, chunked catch-up and (K+1)-token verification; a sequence's logits are
// bit-identical whichever of those it is part of (see kernels/backend.h on batch invariance).
#ifndef SPECD_COMMON_ENGINE_LLAMA_ENGINE_H_
#define SPECD_COMMON_ENGINE_LLAMA_ENGINE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_pool.h"
#include "common/model/weights.h"
#include "kernels/backend.h"

namespace specd {

struct EngineOptions {
  int64_t kv_block_size = 16;
  // KV capacity in tokens across all sequences (rounded up to whole blocks).
  int64_t kv_capacity_tokens = 8192;
  // Longest sequence served; 0 means the model's max_position_embeddings.
  int64_t max_seq_len = 0;
};

// One sequence's part of a forward call.
struct SequenceInput {
  KvPool::SeqId seq = 0;
  // New tokens, fed at positions [start_pos, start_pos + tokens.size()).
  std::span<const int32_t> tokens;
  // Must equal the sequence's cached length: the caller states what it believes is cached, so a
  // disagreement is caught instead of silently attending to the wrong prefix.
  int64_t start_pos = 0;
  // Indices into `tokens` whose next-token logits are wanted, strictly increasing.
  std::vector<int32_t> logit_indices;
};

struct ForwardResult {
  int64_t vocab_size = 0;
  // Rows in batch order, then in `logit_indices` order: [sum of logit_indices sizes, vocab_size].
  std::vector<float> logits;
  std::span<const float> row(int64_t i) const {
    return {logits.data() + i * vocab_size, static_cast<size_t>(vocab_size)};
  }
};

class LlamaEngine {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaEngine>> Create(
      std::unique_ptr<ModelWeights> weights, std::unique_ptr<kernels::Backend> backend,
      const EngineOptions& options);

  // Runs the model on `batch`, appending every fed token to its sequence's KV. Validates the
  // whole batch first: unknown sequence (NOT_FOUND), wrong start_pos (FAILED_PRECONDITION), token
  // id out of range or bad logit index (INVALID_ARGUMENT), over max_seq_len (OUT_OF_RANGE), KV
  // exhausted (RESOURCE_EXHAUSTED). On any error no sequence's cached length changes.
  absl::StatusOr<ForwardResult> Forward(std::span<const SequenceInput> batch);

  absl::Status AddSequence(KvPool::SeqId seq) { return kv_->AddSequence(seq); }
  absl::Status Truncate(KvPool::SeqId seq, int64_t new_len) { return kv_->Truncate(seq, new_len); }
  absl::Status Release(KvPool::SeqId seq) { return kv_->Release(seq); }

  const ModelConfig& config() const { return weights_->config; }
  const ModelWeights& weights() const { return *weights_; }
  const KvPool& kv() const { return *kv_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  kernels::Backend& backend() { return *backend_; }

 private:
  LlamaEngine(std::unique_ptr<ModelWeights> weights, std::unique_ptr<kernels::Backend> backend,
              std::unique_ptr<KvPool> kv, int64_t max_seq_len);

  absl::Status Validate(std::span<const SequenceInput> batch) const;
  absl::Status RunLayers(int64_t n_tokens);

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<KvPool> kv_;
  int64_t max_seq_len_;
  std::vector<float> inv_freq_;
  std::vector<float> k_cache_;  // [layer][block][slot][kv_dim]
  std::vector<float> v_cache_;

  // Per-call scratch, grown as needed and reused.
  struct Scratch {
    std::vector<int32_t> ids, pos, token_seq, block_tables;
    std::vector<float> x, h, q, k, v, att, gate, up;
  } s_;
  int64_t block_table_stride_ = 0;
};

// Loads `dir` and builds an engine on the CPU back end with `num_threads` threads.
absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateCpuEngine(const std::filesystem::path& dir,
                                                             int num_threads,
                                                             const EngineOptions& options,
                                                             const LoadOptions& load = {});

}  // namespace specd

#endif  // SPECD_COMMON_ENGINE_LLAMA_ENGINE_H_
