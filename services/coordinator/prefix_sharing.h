// In-batch prefix sharing: prompts that begin alike and are read at the same time compute their
// common KV once (SGLang's scheduler holds such requests back the same way, "in-batch prefix
// caching"). Without it, n completions of one prompt (HTTP `n`) and a burst of requests behind one
// new system prompt each compute the shared blocks in the same round, and the workers' prefix
// caches only dedupe the copies afterwards (KvPool::CacheCommitted).
//
// A sequence sits a round out when another sequence of the batch, at least as far along on the
// target, still has to compute at least kMinSharedPrefixTokens of prompt KV (whole blocks) that it
// would otherwise compute too. Once the other has them they are in both workers' prefix caches,
// and the waiting sequence's next call attaches them. On a compute-bound device the wait costs it
// nothing: its own prefill would have shared the round with the other's anyway.
//
// "Far along" counts what the target will take from its prefix cache, as far as the scheduler
// knows it: ComputedPrefixes remembers the blocks the target computed lately. Without it, every
// request behind a system prompt that is long cached would wait a round for whichever arrived
// first, for nothing; with it, only blocks evicted behind the scheduler's back (or lost in a
// worker restart) are misjudged, and then sequences compute alongside as without sharing.
//
// Never waiting: sequences that are not catching up on the target (decoding streams), prompts
// being scored (their prompt logprobs need every position computed), and any sequence when the
// target caches no prefixes.
#ifndef SPECD_SERVICES_COORDINATOR_PREFIX_SHARING_H_
#define SPECD_SERVICES_COORDINATOR_PREFIX_SHARING_H_

#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "services/coordinator/speculation_round.h"

namespace specd {

// Shorter shared spans are computed by each sequence: a round's wait would cost more than the
// recomputation saves. SGLang's threshold for the same decision.
inline constexpr int64_t kMinSharedPrefixTokens = 32;

// The whole blocks the target worker computed lately, by a hash chained over the tokens of every
// block up to them (the worker's own cache key, up to the salt): what its prefix cache probably
// holds. Least recently seen blocks are forgotten first once `capacity` (the target's pool size)
// are known, as the worker evicts its least recently released blocks first.
class ComputedPrefixes {
 public:
  ComputedPrefixes(int64_t block_size, int64_t capacity);

  // Records the whole blocks among the first `committed` of `tokens` (a sequence's tokens, of
  // which the target holds `committed`). `chain` is the sequence's memo of its block hashes so
  // far, extended here, so a round costs only the blocks it completed.
  void Record(std::span<const int32_t> tokens, int64_t committed, std::vector<uint64_t>& chain);
  // The blocks of a sequence that the target let go of (it finished): the most recent to stay.
  void Touch(std::span<const uint64_t> chain);
  // Leading tokens of `tokens`, in whole blocks and at most `max_tokens`, recorded as computed.
  int64_t KnownPrefix(std::span<const int32_t> tokens, int64_t max_tokens) const;
  // The target restarted: its cache is empty.
  void Clear();

  int64_t block_size() const { return block_size_; }
  int64_t size() const { return static_cast<int64_t>(recent_.size()); }

 private:
  void Insert(uint64_t hash);

  int64_t block_size_;
  int64_t capacity_;
  std::list<uint64_t> recent_;  // most recently seen first
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

// For each sequence of `batch` (in admission order: ties go to the earlier), whether it waits this
// round. `known` is null when the target caches no prefixes (nothing waits).
std::vector<bool> WaitsForSharedPrefix(std::span<const SpeculativeSequence* const> batch,
                                       const ComputedPrefixes* known);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_PREFIX_SHARING_H_
