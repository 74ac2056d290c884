// Paged KV block allocator: fixed-size blocks, per-sequence block tables, free-capacity
// accounting. It owns bookkeeping only; the cache memory lives with the engine's back end, so the
// same allocator serves host and device caches (vLLM's BlockSpaceManager plays this role).
#ifndef SPECD_COMMON_KV_KV_POOL_H_
#define SPECD_COMMON_KV_KV_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

struct KvPoolConfig {
  int64_t num_blocks = 0;
  int64_t block_size = 16;         // tokens per block
  int64_t max_blocks_per_seq = 0;  // ceil(max_seq_len / block_size)
};

class KvPool {
 public:
  using SeqId = uint64_t;

  // INVALID_ARGUMENT for non-positive sizes or absurd totals.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvPoolConfig& config);

  // ALREADY_EXISTS if present. A new sequence has length 0 and holds no blocks.
  absl::Status AddSequence(SeqId seq);
  bool Has(SeqId seq) const;
  // NOT_FOUND for unknown sequences.
  absl::StatusOr<int64_t> Length(SeqId seq) const;

  // Grows `seq` to `new_len` tokens, allocating blocks as needed. `new_len` below the current
  // length is INVALID_ARGUMENT; over max_blocks_per_seq * block_size is OUT_OF_RANGE; not enough
  // free blocks is RESOURCE_EXHAUSTED. On any error the pool is unchanged.
  absl::Status Extend(SeqId seq, int64_t new_len);

  // Shrinks `seq` to min(length, new_len) and frees whole blocks past it. Idempotent.
  absl::Status Truncate(SeqId seq, int64_t new_len);

  // Frees every block of `seq` and forgets it. NOT_FOUND if unknown.
  absl::Status Release(SeqId seq);

  // Blocks `seq` would need in addition to grow to `new_len` (0 if it already fits).
  absl::StatusOr<int64_t> BlocksNeeded(SeqId seq, int64_t new_len) const;

  // The block ids of `seq`, in position order. NOT_FOUND if unknown.
  absl::StatusOr<const std::vector<int32_t>*> BlockTable(SeqId seq) const;

  int64_t block_size() const { return config_.block_size; }
  int64_t max_blocks_per_seq() const { return config_.max_blocks_per_seq; }
  int64_t total_blocks() const { return config_.num_blocks; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t used_blocks() const { return total_blocks() - free_blocks(); }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };

  explicit KvPool(const KvPoolConfig& config);

  KvPoolConfig config_;
  std::vector<int32_t> free_list_;  // LIFO: recently freed blocks are reused first (warm cache)
  absl::flat_hash_map<SeqId, Sequence> seqs_;
};

}  // namespace specd

#endif  // SPECD_COMMON_KV_KV_POOL_H_
