// The hash chain over full blocks of tokens that prefix caching keys on: the worker's KV pool
// and the coordinator's model of what its target has computed hash blocks the same way.
#ifndef SPECD_BASE_BLOCK_HASH_H_
#define SPECD_BASE_BLOCK_HASH_H_

#include <cstdint>
#include <span>

#include "absl/hash/hash.h"
#include "absl/types/span.h"

namespace specd {

// A full block's hash, chained from its parent's (a chain's root value for the first block).
inline uint64_t ChainedBlockHash(uint64_t parent, std::span<const int32_t> tokens) {
  return absl::HashOf(parent, absl::MakeConstSpan(tokens.data(), tokens.size()));
}

}  // namespace specd

#endif  // SPECD_BASE_BLOCK_HASH_H_
