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

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/device_weights.h"
#include "common/kv/kv_pool.h"
#include "common/model/weights.h"
#include "kernels/backend.h"

namespace specd {

inline constexpr int64_t kDefaultMaxPassTokens = 2048;

struct EngineOptions {
  int64_t kv_block_size = 16;
  // KV capacity in tokens across all sequences (rounded up to whole blocks).
  int64_t kv_capacity_tokens = 8192;
  // Longest sequence served; 0 means the model's max_position_embeddings.
  int64_t max_seq_len = 0;
  kernels::DType kv_dtype = kernels::DType::kF32;
  // Automatic prefix caching in the KV pool (common/kv/kv_pool.h).
  bool prefix_caching = true;
  // Record forward passes of up to kMaxRecordedTokens tokens (decode and verify shapes) as one
  // replayable unit per shape bucket (RecordedBucket: the pass is padded up to it), on back ends
  // that record (CUDA graphs): a decode step is then one launch instead of ~16 per layer. A
  // bucket is recorded the second time it is seen, so one-off prefill shapes never pay for
  // recording. No effect on the CPU.
  bool record_forwards = true;
  // The share of the device's memory this engine may use (vLLM's gpu_memory_utilization), on
  // back ends with device memory. When > 0 the KV cache takes what remains of that share after
  // the weights and a scratch reserve, and kv_capacity_tokens is ignored; RESOURCE_EXHAUSTED,
  // naming the bytes, when nothing remains or the device has less free.
  double gpu_memory_fraction = 0.0;
  // With gpu_memory_fraction: the other worker sharing the device (its estimated memory, see
  // EstimateModelMemory). Then the fraction is both workers' share together, and each sizes its
  // KV cache so that the two pools hold the same number of tokens (every sequence lives in both,
  // so the smaller pool would set the capacity). Both workers compute the same token count from
  // the same estimates.
  int64_t peer_fixed_bytes = 0;         // the peer's weights and scratch reserve
  int64_t peer_kv_bytes_per_token = 0;  // 0: no peer, the fraction is this engine's alone
  // The tokens of the largest forward pass the scratch reserve is sized for (vLLM's
  // max_num_batched_tokens). The coordinator keeps every pass within it (pass_budget.h), so the
  // memory share holds while prefill chunks of many sequences meet in one pass; a larger pass
  // still runs, growing the scratch past the reserve.
  int64_t max_pass_tokens = kDefaultMaxPassTokens;
};

// What a model will take on a device, from its config alone (for sizing before loading).
struct ModelMemory {
  int64_t weights_bytes = 0;
  int64_t scratch_reserve_bytes = 0;  // activations, logits and kept rows of a busy worker
  int64_t kv_bytes_per_token = 0;
};
ModelMemory EstimateModelMemory(const ModelConfig& config, kernels::DType kv_dtype,
                                int64_t max_pass_tokens);
// KV tokens for an engine of `own` when `fraction` of a device of `total_bytes` is shared with a
// peer as EngineOptions describes (peer_kv_bytes_per_token 0: no peer). RESOURCE_EXHAUSTED,
// naming the bytes, when nothing is left for the cache.
absl::StatusOr<int64_t> KvTokensForShare(const ModelMemory& own, double fraction,
                                         int64_t total_bytes, int64_t peer_fixed_bytes,
                                         int64_t peer_kv_bytes_per_token);

// Forward passes are recorded per shape bucket (RecordedBucket) of at most this many tokens, and
// at most this many recordings are kept (the least recently replayed goes first).
inline constexpr int64_t kMaxRecordedTokens = 256;
inline constexpr size_t kMaxRecordedShapes = 48;

// The bucket a recorded pass's token, sequence or logit-row count is padded up to: exact up to
// 8, then multiples of 8 up to 64, of 16 up to 128, of 32 beyond. A busy server's passes (decode
// steps, verifies, draft catch-ups of 1 to K+1 tokens per sequence) then share a few recordings
// instead of needing one per exact shape; the padding costs little where recording pays (small,
// launch-bound passes that read every weight once whatever their rows).
constexpr int64_t RecordedBucket(int64_t n) {
  const int64_t step = n <= 8 ? 1 : n <= 64 ? 8 : n <= 128 ? 16 : 32;
  return (n + step - 1) / step * step;
}

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
  // Draft trees. Empty `tree_mask`: a plain causal feed, token i at position start_pos + i.
  // Otherwise tokens[tree_begin + j] is tree node tree_first_node + j (at most 64 nodes in all):
  // it sees every token before the tree's node 0 and node k iff bit k of tree_mask[j] is set (its
  // ancestors and itself), and `positions` (one per token) gives each token's position in the
  // text, so nodes at the same depth share a RoPE position. Nodes 0..tree_first_node - 1 were fed
  // by earlier calls, in the KV slots just before this call's: a draft worker grows its tree one
  // level per call.
  std::span<const int32_t> positions;
  int32_t tree_begin = 0;
  int32_t tree_first_node = 0;
  std::span<const uint64_t> tree_mask;
};

// Logit rows in back-end memory: rows in batch order, then in `logit_indices` order. Valid until
// the next Forward, and the caller's to overwrite until then (classifier-free guidance combines
// rows in place). `vocab` is the classifier's width (LlamaEngine::logits_width()).
struct Logits {
  float* data = nullptr;  // [rows, vocab]
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

  // Moves the KV of slot tree_start + kept_nodes[i] to slot tree_start + i in every layer, then
  // truncates the sequence to tree_start + kept_nodes.size(): only the accepted branch of a draft
  // tree remains. kept_nodes must be strictly increasing and inside the sequence. The one place
  // that rewrites KV in place: the slots written must be in blocks only this sequence holds and
  // the prefix cache does not (FAILED_PRECONDITION otherwise, with nothing changed), and the
  // tokens the pool records for them move too (KvPool::CompactTokens).
  absl::Status CompactKv(KvPool::SeqId seq, int64_t tree_start,
                         std::span<const int32_t> kept_nodes);

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
  // EngineOptions::max_pass_tokens: the pass the scratch reserve was sized for.
  int64_t max_pass_tokens() const { return max_pass_tokens_; }
  kernels::DType kv_dtype() const { return kv_dtype_; }
  // Bytes of KV cache one token takes across all layers (k and v).
  int64_t kv_bytes_per_token() const;
  kernels::Backend& backend() { return *backend_; }
  const kernels::Backend& backend() const { return *backend_; }
  const DeviceWeights& weights() const { return weights_; }
  // The tokens the classifier scores (LoadOptions::output_vocab), ascending; empty = all. Logit
  // row entry i is token output_vocab()[i] then.
  std::span<const int32_t> output_vocab() const { return output_vocab_; }
  int64_t logits_width() const { return weights_.lm_head.rows; }

 private:
  LlamaEngine(ModelConfig config, std::unique_ptr<kernels::Backend> backend,
              std::unique_ptr<KvPool> kv, int64_t max_seq_len, kernels::DType kv_dtype);

  absl::Status Validate(std::span<const SequenceInput> batch) const;
  // Appends every sequence's tokens to the pool, or none when the batch does not fit.
  absl::Status ReserveKv(std::span<const SequenceInput> batch);
  // Fills the staging buffer with ids, positions, slots, block tables, logit rows, the tree mask
  // and the rows of pending block copies, uploads them in one copy, and enqueues the copies (never
  // recorded: they come before the model, whose recordings stay keyed by its shape alone).
  // A pass's shape: its real counts, or a recorded pass's buckets (RecordedBucket). Rows past
  // the real ones are padding: pad tokens feed the trash sequence (see trash_blocks_), pad
  // sequences have empty block tables and pad logit rows repeat row 0.
  struct Shape {
    int64_t tokens, seqs, logits;
    bool tree;
    int64_t table_stride;  // block-table entries uploaded per sequence (TableStride)
    bool operator==(const Shape&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Shape& k) {
      return H::combine(std::move(h), k.tokens, k.seqs, k.logits, k.tree, k.table_stride);
    }
  };
  // How wide this pass's block tables are: its longest sequence's table (and the trash
  // sequence's when padded), a recorded pass's rounded up to a power of two so that a decoding
  // batch keeps one shape for many steps, never past the longest a sequence may have. Not the
  // widest any sequence may have: at a 131072-token context that is 8192 entries per sequence,
  // uploaded every pass, and the attention kernels size their split grid from it.
  absl::StatusOr<int64_t> TableStride(std::span<const SequenceInput> batch, bool padded) const;
  absl::Status UploadMetadata(std::span<const SequenceInput> batch, const Shape& shape,
                              std::span<const KvBlockCopy> copies);
  absl::Status CopyBlocks(int64_t n_rows);
  absl::Status GrowScratch(int64_t n_tokens, int64_t n_logits);
  absl::Status RunLayers(int64_t n_tokens);
  absl::StatusOr<Logits> Enqueue(std::span<const SequenceInput> batch, int64_t n_tokens,
                                 int64_t n_logits);
  // The model from the embedding to the logits, on the current metadata and scratch.
  absl::Status EnqueueModel(int64_t n_tokens, int64_t n_logits);
  // EnqueueModel of a padded shape through its recording when there is (or should now be) one.
  absl::Status EnqueueModelRecorded(const Shape& shape);
  // KV blocks on the back end: the pool's, then the trash sequence's.
  int64_t device_blocks() const { return kv_->total_blocks() + trash_blocks_; }

  const ModelConfig config_;
  // Declared first so that it is destroyed last: every Buffer below belongs to it.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<KvPool> kv_;
  const int64_t max_seq_len_;
  const kernels::DType kv_dtype_;
  DeviceWeights weights_;
  std::vector<int32_t> output_vocab_;
  kernels::Buffer k_cache_;  // [layer][block][slot][kv_dim] of kv_dtype_
  kernels::Buffer v_cache_;

  // Per-forward metadata, in one staging buffer and its device copy; see UploadMetadata.
  struct Metadata {
    const int32_t* ids = nullptr;
    const int32_t* pos = nullptr;
    const int32_t* slot = nullptr;
    const int32_t* token_seq = nullptr;
    const int32_t* block_tables = nullptr;  // [seqs, table_stride]
    int64_t table_stride = 0;
    const int32_t* logit_rows = nullptr;
    const uint64_t* tree_mask = nullptr;  // null when no sequence feeds a tree
    const int32_t* mask_start = nullptr;
    const int32_t* copy_src = nullptr;  // KV rows of copy-on-write sources and destinations
    const int32_t* copy_dst = nullptr;
  } meta_;
  kernels::Buffer staging_;
  kernels::Buffer meta_device_;
  kernels::Buffer compact_staging_;  // CompactKv's row pairs
  kernels::Buffer compact_device_;
  // Set while staging_ may still be read by an enqueued upload.
  bool staging_in_flight_ = false;

  // Recorded forward passes by padded shape, valid while buffers_generation_ is what it was
  // when they were recorded (a grown buffer moves), each with when it was last replayed.
  struct Recording {
    std::unique_ptr<kernels::RecordedWork> work;
    int64_t last_used = 0;
  };
  // Blocks after the pool's in the KV cache that pad tokens write and read (slot j of the trash
  // sequence for pad token j), so padding never touches a real sequence's KV. 0 when passes are
  // not recorded (EngineOptions::record_forwards off, a back end that does not record, or a
  // context shorter than the padding), and then nothing is padded.
  int64_t trash_blocks_ = 0;
  int64_t max_pass_tokens_ = kDefaultMaxPassTokens;
  int64_t buffers_generation_ = 0;
  int64_t recorded_generation_ = 0;
  int64_t replay_clock_ = 0;
  absl::flat_hash_map<Shape, Recording> recorded_;
  absl::flat_hash_map<Shape, int> shape_seen_;

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
