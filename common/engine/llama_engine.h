// The Llama forward pass over a varlen batch with a paged KV cache, driven through the back end's
// ops (kernels/backend.h). One code path serves prefill, one-token decode, chunked catch-up,
// (K+1)-token verification and draft-tree verification; a sequence's logits are bit-identical
// whichever of those it is part of, because every op is batch invariant.
//
// Execution: Forward enqueues its work on the back end's stream and returns a view of the logits
// in back-end memory without waiting. The caller reads what it needs (usually through
// common/sampling/row_sampler.h, which turns logit rows into tokens on the back end) and then
// synchronizes once. The engine holds no activations in host memory.
#ifndef SPECD_COMMON_ENGINE_LLAMA_ENGINE_H_
#define SPECD_COMMON_ENGINE_LLAMA_ENGINE_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/device_weights.h"
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
  kernels::DType kv_dtype = kernels::DType::kF32;
  // Automatic prefix caching in the KV pool (common/kv/kv_pool.h).
  bool prefix_caching = true;
};

// One sequence's part of a forward call.
struct SequenceInput {
  KvPool::SeqId seq = 0;
  // New tokens, stored at KV slots [start_pos, start_pos + tokens.size()).
  std::span<const int32_t> tokens;
  // Must equal the sequence's cached length: the caller states what it believes is cached, so a
  // disagreement is caught instead of silently attending to the wrong prefix.
  int64_t start_pos = 0;
  // Indices into `tokens` whose next-token logits are wanted, strictly increasing.
  std::vector<int32_t> logit_indices;
  // Draft-tree verification. Empty `tree_mask`: a plain causal feed, token i at position
  // start_pos + i. Otherwise tokens[tree_begin + j] is tree node j (at most 64 nodes): it sees
  // every token before tree_begin and node k iff bit k of tree_mask[j] is set (its ancestors and
  // itself), and `positions` (one per token) gives each token's position in the text, so nodes at
  // the same depth share a RoPE position.
  std::span<const int32_t> positions;
  int32_t tree_begin = 0;
  std::span<const uint64_t> tree_mask;
};

// Logit rows in back-end memory: rows in batch order, then in `logit_indices` order. Valid until
// the next Forward.
struct Logits {
  const float* data = nullptr;  // [rows, vocab]
  int64_t rows = 0;
  int64_t vocab = 0;
};

class LlamaEngine {
 public:
  // Uploads `weights` (then released) and allocates the KV cache on `backend`. `progress(done,
  // total)` reports the upload in bytes; it may be empty.
  static absl::StatusOr<std::unique_ptr<LlamaEngine>> Create(
      std::unique_ptr<ModelWeights> weights, std::unique_ptr<kernels::Backend> backend,
      const EngineOptions& options, const std::function<void(int64_t, int64_t)>& progress = {});
  ~LlamaEngine();

  // Enqueues the model on `batch`, appending every fed token to its sequence's KV (after the
  // copies of shared partially filled blocks that the appends make). Validates the whole batch
  // first: unknown sequence (NOT_FOUND), wrong start_pos (FAILED_PRECONDITION), token id out of
  // range, bad logit index or bad tree (INVALID_ARGUMENT), over max_seq_len (OUT_OF_RANGE), KV
  // exhausted (RESOURCE_EXHAUSTED). On any error no sequence's cached length or blocks change.
  absl::StatusOr<Logits> Forward(std::span<const SequenceInput> batch);

  // Waits for everything enqueued (the one synchronization point of a forward pass).
  absl::Status Synchronize();

  // `logits` copied to the host; synchronizes. For tests, tools and references.
  absl::StatusOr<std::vector<float>> ReadLogits(const Logits& logits);

  absl::Status AddSequence(KvPool::SeqId seq) { return kv_->AddSequence(seq); }
  absl::Status Truncate(KvPool::SeqId seq, int64_t new_len) { return kv_->Truncate(seq, new_len); }
  absl::Status Release(KvPool::SeqId seq) { return kv_->Release(seq); }
  // The prefix cache (KvPool::AttachCached and KvPool::CacheCommitted). Only tokens whose KV has
  // been enqueued by a successful Forward may be offered to the cache.
  absl::StatusOr<int64_t> AttachCached(KvPool::SeqId seq, std::span<const int32_t> tokens,
                                       int64_t max_tokens) {
    return kv_->AttachCached(seq, tokens, max_tokens);
  }
  absl::Status CacheCommitted(KvPool::SeqId seq, int64_t committed) {
    return kv_->CacheCommitted(seq, committed);
  }

  const ModelConfig& config() const { return config_; }
  const KvPool& kv() const { return *kv_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  kernels::DType kv_dtype() const { return kv_dtype_; }
  // Bytes of KV cache one token takes across all layers (k and v).
  int64_t kv_bytes_per_token() const;
  kernels::Backend& backend() { return *backend_; }
  const kernels::Backend& backend() const { return *backend_; }
  const DeviceWeights& weights() const { return weights_; }

 private:
  LlamaEngine(ModelConfig config, std::unique_ptr<kernels::Backend> backend,
              std::unique_ptr<KvPool> kv, int64_t max_seq_len, kernels::DType kv_dtype);

  absl::Status Validate(std::span<const SequenceInput> batch) const;
  // Appends every sequence's tokens to the pool, or none when the batch does not fit.
  absl::Status ReserveKv(std::span<const SequenceInput> batch);
  // Fills the staging buffer with ids, positions, slots, block tables, logit rows, the tree mask
  // and the rows of pending block copies, and uploads them in one copy.
  absl::Status UploadMetadata(std::span<const SequenceInput> batch, int64_t n_tokens,
                              int64_t n_logits, std::span<const KvBlockCopy> copies);
  absl::Status GrowScratch(int64_t n_tokens, int64_t n_logits);
  absl::Status CopyBlocks(int64_t n_rows);
  absl::Status RunLayers(int64_t n_tokens);
  absl::StatusOr<Logits> Enqueue(std::span<const SequenceInput> batch, int64_t n_tokens,
                                 int64_t n_logits);

  const ModelConfig config_;
  // Declared first so that it is destroyed last: every Buffer below belongs to it.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<KvPool> kv_;
  const int64_t max_seq_len_;
  const kernels::DType kv_dtype_;
  DeviceWeights weights_;
  kernels::Buffer k_cache_;  // [layer][block][slot][kv_dim] of kv_dtype_
  kernels::Buffer v_cache_;

  // Per-forward metadata, in one staging buffer and its device copy; see UploadMetadata.
  struct Metadata {
    const int32_t* ids = nullptr;
    const int32_t* pos = nullptr;
    const int32_t* slot = nullptr;
    const int32_t* token_seq = nullptr;
    const int32_t* block_tables = nullptr;
    const int32_t* logit_rows = nullptr;
    const uint64_t* tree_mask = nullptr;  // null when no sequence feeds a tree
    const int32_t* mask_start = nullptr;
    const int32_t* copy_src = nullptr;  // KV rows of copy-on-write sources and destinations
    const int32_t* copy_dst = nullptr;
  } meta_;
  kernels::Buffer staging_;
  kernels::Buffer meta_device_;
  // Set while staging_ may still be read by an enqueued upload.
  bool staging_in_flight_ = false;

  // Activations, grown as needed and reused.
  struct Scratch {
    kernels::Buffer x, h, q, k, v, att, gate, up, xr, logits;
    int64_t tokens = 0;
    int64_t logit_rows = 0;
  } s_;
};

// Loads `dir` and builds an engine on the back end `backend_options` names.
absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateEngine(
    const std::filesystem::path& dir, const kernels::BackendOptions& backend_options,
    const EngineOptions& options, const LoadOptions& load = {});

// The same on the CPU back end with `num_threads` threads.
absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateCpuEngine(const std::filesystem::path& dir,
                                                             int num_threads,
                                                             const EngineOptions& options,
                                                             const LoadOptions& load = {});

}  // namespace specd

#endif  // SPECD_COMMON_ENGINE_LLAMA_ENGINE_H_
