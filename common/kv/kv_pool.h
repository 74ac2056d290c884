// Paged KV block allocator with automatic prefix caching: fixed-size blocks, per-sequence block
// tables, reference-counted sharing, free-capacity accounting. It owns bookkeeping only; the cache
// memory lives with the engine's back end, so the same allocator serves host and device caches
// (vLLM's BlockSpaceManager and KVCacheManager play this role).
//
// Prefix caching. A full block of committed tokens is content-addressed by a hash of (its parent
// block's hash, its tokens), chained from a salt that names the model and the KV dtype. A later
// sequence whose tokens begin the same way attaches the cached blocks by reference instead of
// recomputing them; every hit is confirmed by comparing the block's tokens and its parent, so a
// hash collision can never serve wrong KV. Blocks nothing references stay cached until the pool
// needs room, and are then evicted least recently used first; they count as free capacity.
//
// The rule that keeps shared KV intact: a block that another sequence or the cache references is
// never written. Only full blocks are ever shared (cached, attached or forked) or written in
// place, except a sequence's partially filled last block, which Append copies to a private block
// first (copy on write) when anything else holds it.
#ifndef SPECD_COMMON_KV_KV_POOL_H_
#define SPECD_COMMON_KV_KV_POOL_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

// The hash of one full block given its parent's hash (the salt for the first block).
using KvBlockHash = uint64_t (*)(uint64_t parent, std::span<const int32_t> tokens);

struct KvPoolConfig {
  int64_t num_blocks = 0;
  int64_t block_size = 16;         // tokens per block
  int64_t max_blocks_per_seq = 0;  // ceil(max_seq_len / block_size)
  // Keep full blocks of committed tokens for later sequences that share the prefix.
  bool prefix_caching = false;
  // The root of every hash chain: the model's identity and the KV dtype, so KV computed by
  // another model or in another precision can never match.
  uint64_t cache_salt = 0;
  // The block hash; null uses ChainedBlockHash. Tests substitute one that collides.
  KvBlockHash block_hash = nullptr;
};

// Rows [0, rows) of block `src` copied to block `dst`, in every layer (copy on write).
struct KvBlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
  int64_t rows = 0;
};

class KvPool {
 public:
  using SeqId = uint64_t;

  // INVALID_ARGUMENT for non-positive sizes or absurd totals.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvPoolConfig& config);

  // ALREADY_EXISTS if present. A new sequence has length 0 and holds no blocks.
  absl::Status AddSequence(SeqId seq);
  // A new sequence `child` with `parent`'s tokens, holding the same blocks by reference: nothing
  // is copied until one of them writes into a shared partially filled block. For completions
  // that share a prompt, and for companion sequences. NOT_FOUND / ALREADY_EXISTS.
  absl::Status Fork(SeqId parent, SeqId child);
  bool Has(SeqId seq) const;
  // NOT_FOUND for unknown sequences.
  absl::StatusOr<int64_t> Length(SeqId seq) const;

  // Appends `tokens` to `seq`, taking blocks from the free list and then evicting unreferenced
  // cached blocks, least recently used first. More than max_blocks_per_seq * block_size tokens is
  // OUT_OF_RANGE; not enough free capacity is RESOURCE_EXHAUSTED. On any error the pool is
  // unchanged. When the sequence's partially filled last block is held by anything else, the
  // sequence moves to a fresh block first, and the copy the caller must make before writing KV is
  // queued (copy on write).
  absl::Status Append(SeqId seq, std::span<const int32_t> tokens);

  // The copies Append queued. Until ConfirmCopies or RevertCopies their sources stay referenced,
  // so nothing can evict and overwrite them before the copies run.
  std::vector<KvBlockCopy> PendingCopies() const;
  // The pending copies are enqueued: their sources are let go.
  void ConfirmCopies();
  // The pending copies will never run (the pass failed first): every sequence that moved to a
  // fresh block moves back to the original, which it still holds. Call after truncating the
  // sequences back to where they were.
  void RevertCopies();

  // Shrinks `seq` to min(length, new_len) and lets go of whole blocks past it. Idempotent.
  // INVALID_ARGUMENT for a negative length.
  absl::Status Truncate(SeqId seq, int64_t new_len);

  // Lets go of every block of `seq` and forgets it. NOT_FOUND if unknown.
  absl::Status Release(SeqId seq);

  // Blocks that Append(seq, n tokens) would take from the free capacity.
  absl::StatusOr<int64_t> BlocksNeeded(SeqId seq, int64_t n_tokens) const;

  // Whether the KV of slot tree_start + kept_nodes[i] may move to slot tree_start + i
  // (LlamaEngine::CompactKv keeps a draft tree's accepted branch, and asks before it copies):
  // kept_nodes strictly increasing, node i at or after entry i, inside the sequence
  // (INVALID_ARGUMENT); every slot written in a block only `seq` holds and the cache does not
  // (FAILED_PRECONDITION: the KV write would be seen by others). NOT_FOUND if unknown.
  absl::Status CheckCompaction(SeqId seq, int64_t tree_start,
                               std::span<const int32_t> kept_nodes) const;

  // Records that move once the KV has moved: with prefix caching the token recorded at each
  // destination moves too, so that a block is cached under the tokens its KV was computed from.
  // Checks first (CheckCompaction) and changes nothing on error.
  absl::Status CompactTokens(SeqId seq, int64_t tree_start, std::span<const int32_t> kept_nodes);

  // The block ids of `seq`, in position order. NOT_FOUND if unknown.
  absl::StatusOr<const std::vector<int32_t>*> BlockTable(SeqId seq) const;

  // Prefix caching (both are no-ops when it is off).
  //
  // Grows `seq` with cached blocks that continue it with `tokens`, and returns how many tokens it
  // grew by: whole blocks are matched, up to `max_tokens` are attached (so the last block may be
  // attached partially, and is then copied on the next write). `seq`'s length must be a whole
  // number of blocks, each of them cached; otherwise nothing matches. NOT_FOUND if unknown.
  absl::StatusOr<int64_t> AttachCached(SeqId seq, std::span<const int32_t> tokens,
                                       int64_t max_tokens);
  // Offers the full blocks among `seq`'s first `committed` tokens to the cache, in order. A block
  // whose content is already cached is replaced by the cached one (and freed), so sequences that
  // computed the same prefix at once end up sharing it. NOT_FOUND if unknown.
  absl::Status CacheCommitted(SeqId seq, int64_t committed);

  int64_t block_size() const { return config_.block_size; }
  int64_t max_blocks_per_seq() const { return config_.max_blocks_per_seq; }
  int64_t total_blocks() const { return config_.num_blocks; }
  bool prefix_caching() const { return config_.prefix_caching; }
  uint64_t cache_salt() const { return config_.cache_salt; }
  // Blocks new tokens can take: never used or freed ones, and cached blocks no sequence holds.
  int64_t free_blocks() const {
    return static_cast<int64_t>(free_list_.size() + evictable_.size());
  }
  // Blocks at least one sequence holds.
  int64_t used_blocks() const { return total_blocks() - free_blocks(); }
  // Blocks in the prefix cache, held by sequences or not.
  int64_t cached_blocks() const { return static_cast<int64_t>(cache_.size()); }
  // Cached blocks no sequence holds: the first to go when the pool needs room.
  int64_t evictable_blocks() const { return static_cast<int64_t>(evictable_.size()); }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  // How many sequences hold `block` (pending copies count as holding their source), and whether
  // the cache does. For tests and invariant checks.
  int32_t RefCount(int32_t block) const { return blocks_[static_cast<size_t>(block)].refs; }
  bool IsCached(int32_t block) const { return blocks_[static_cast<size_t>(block)].serial != 0; }

 private:
  struct Block {
    int32_t refs = 0;
    // Nonzero while cached: a number never reused, so a child names exactly this parent even
    // after the parent's id is recycled.
    uint64_t serial = 0;
    uint64_t parent_serial = 0;  // 0 for a sequence's first block
    uint64_t hash = 0;
    std::list<int32_t>::iterator lru;  // valid while cached with refs == 0
  };
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> blocks;
    // Leading blocks known to be cached and chained; CacheCommitted resumes after them.
    int64_t cached = 0;
  };
  struct PendingCopy {
    SeqId seq = 0;
    size_t index = 0;  // in the sequence's block table
    KvBlockCopy copy;
  };

  explicit KvPool(const KvPoolConfig& config);

  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;
  // True when anything but `seq`'s own single reference holds `block`.
  bool Shared(int32_t block) const;
  // A block with no reference and no cache entry: from the free list, else the LRU evictable one.
  int32_t Allocate();
  void Ref(int32_t block);
  void Unref(int32_t block);
  std::span<int32_t> TokensOf(int32_t block);
  std::span<const int32_t> TokensOf(int32_t block) const;
  uint64_t Hash(uint64_t parent, std::span<const int32_t> tokens) const;
  // The cached block with this hash, confirmed by content (the same parent and tokens); -1 if
  // none.
  int32_t Lookup(uint64_t hash, uint64_t parent_serial, std::span<const int32_t> tokens) const;
  // The hash and serial a sequence's block `index` chains from (the salt and 0 for the first).
  std::pair<uint64_t, uint64_t> ParentOf(const Sequence& s, size_t index) const;

  KvPoolConfig config_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_list_;  // LIFO: recently freed blocks are reused first (warm cache)
  std::list<int32_t> evictable_;    // cached, unreferenced; least recently released first
  absl::flat_hash_map<uint64_t, int32_t> cache_;  // hash -> cached block
  std::vector<int32_t> tokens_;                   // [block][slot], kept only with prefix caching
  uint64_t next_serial_ = 1;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  std::vector<PendingCopy> pending_;  // queued by Append
};

}  // namespace specd

#endif  // SPECD_COMMON_KV_KV_POOL_H_
