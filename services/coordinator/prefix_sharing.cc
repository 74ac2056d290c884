#include "services/coordinator/prefix_sharing.h"

#include <algorithm>
#include <cstddef>

#include "base/block_hash.h"

namespace specd {
namespace {

// Has prompt (or replayed) KV to compute on the target this round, and may take it from a cache.
bool CatchingUp(const SpeculativeSequence& s) {
  return !s.scoring() && static_cast<int64_t>(s.tokens.size()) - s.target_cached > 1;
}

// Tokens of `follower` whose KV `leader`'s committed blocks hold, in whole blocks: the common
// prefix, never the follower's last token (a catch-up always feeds it, for logits).
int64_t SharedBlockTokens(const SpeculativeSequence& leader, const SpeculativeSequence& follower,
                          int64_t block_size) {
  const auto limit =
      static_cast<ptrdiff_t>(std::min(leader.tokens.size(), follower.tokens.size() - 1));
  const auto mismatch =
      std::mismatch(leader.tokens.begin(), leader.tokens.begin() + limit, follower.tokens.begin());
  const auto common = static_cast<int64_t>(mismatch.first - leader.tokens.begin());
  return common / block_size * block_size;
}

}  // namespace

ComputedPrefixes::ComputedPrefixes(int64_t block_size, int64_t capacity)
    : block_size_(block_size), capacity_(std::max<int64_t>(capacity, 1)) {}

void ComputedPrefixes::Insert(uint64_t hash) {
  if (const auto it = where_.find(hash); it != where_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second);
    return;
  }
  recent_.push_front(hash);
  where_[hash] = recent_.begin();
  if (static_cast<int64_t>(recent_.size()) > capacity_) {
    where_.erase(recent_.back());
    recent_.pop_back();
  }
}

void ComputedPrefixes::Record(std::span<const int32_t> tokens, int64_t committed,
                              std::vector<uint64_t>& chain) {
  const int64_t blocks =
      std::min<int64_t>(committed, static_cast<int64_t>(tokens.size())) / block_size_;
  for (auto b = static_cast<int64_t>(chain.size()); b < blocks; ++b) {
    const uint64_t parent = b == 0 ? 0 : chain.back();
    chain.push_back(ChainedBlockHash(parent, tokens.subspan(static_cast<size_t>(b * block_size_),
                                                            static_cast<size_t>(block_size_))));
    Insert(chain.back());
  }
}

void ComputedPrefixes::Touch(std::span<const uint64_t> chain) {
  // The tail first, so that the prefix ends up the most recent (the worker evicts a released
  // sequence's tail before its prefix too).
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    if (where_.contains(*it)) Insert(*it);
  }
}

int64_t ComputedPrefixes::KnownPrefix(std::span<const int32_t> tokens, int64_t max_tokens) const {
  const int64_t blocks =
      std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size())) / block_size_;
  uint64_t hash = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    hash = ChainedBlockHash(hash, tokens.subspan(static_cast<size_t>(b * block_size_),
                                                 static_cast<size_t>(block_size_)));
    if (!where_.contains(hash)) return b * block_size_;
  }
  return blocks * block_size_;
}

void ComputedPrefixes::Clear() {
  recent_.clear();
  where_.clear();
}

std::vector<bool> WaitsForSharedPrefix(std::span<const SpeculativeSequence* const> batch,
                                       const ComputedPrefixes* known) {
  std::vector<bool> waits(batch.size(), false);
  if (known == nullptr) return waits;
  // Where each sequence's computing starts this round: past what the target holds for it and
  // what its prefix cache is known to hold.
  std::vector<int64_t> start(batch.size(), 0);
  std::vector<size_t> order;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (CatchingUp(*batch[i])) order.push_back(i);
  }
  // The usual round has at most one prompt to read: nothing to share, so nothing to hash.
  if (order.size() < 2) return waits;
  for (const size_t i : order) {
    const SpeculativeSequence& s = *batch[i];
    start[i] = std::max(s.target_cached,
                        known->KnownPrefix(s.tokens, static_cast<int64_t>(s.tokens.size()) - 1));
  }
  // The furthest along computes first, so that a leader never waits for its followers; of those
  // as far along, the one that computed its way there, so that a leader keeps its role while the
  // others can attach its blocks.
  std::stable_sort(order.begin(), order.end(), [&start, &batch](size_t a, size_t b) {
    if (start[a] != start[b]) return start[a] > start[b];
    return batch[a]->target_cached > batch[b]->target_cached;
  });
  std::vector<size_t> leaders;
  for (const size_t i : order) {
    for (const size_t l : leaders) {
      const int64_t shared = SharedBlockTokens(*batch[l], *batch[i], known->block_size());
      if (start[l] < shared && shared - start[i] >= kMinSharedPrefixTokens) {
        waits[i] = true;
        break;
      }
    }
    if (!waits[i]) leaders.push_back(i);
  }
  return waits;
}

}  // namespace specd
