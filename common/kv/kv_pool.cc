#include "common/kv/kv_pool.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "base/block_hash.h"
#include "base/math.h"
#include "base/status_macros.h"

namespace specd {
namespace {

// Block ids are int32 in block tables; stay well inside that and inside host memory for tables.
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

absl::Status Unknown(KvPool::SeqId seq) {
  return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvPoolConfig& config) {
  if (config.num_blocks <= 0 || config.num_blocks > kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool: num_blocks must be in [1, ",
                                                   kMaxBlocks, "], got ", config.num_blocks));
  }
  if (config.block_size <= 0 || config.block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool: block_size must be in [1, 4096], got ", config.block_size));
  }
  if (config.max_blocks_per_seq <= 0 || config.max_blocks_per_seq > kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool: max_blocks_per_seq must be in [1, ",
                                                   kMaxBlocks, "], got ",
                                                   config.max_blocks_per_seq));
  }
  if (config.prefix_caching &&
      config.num_blocks > std::numeric_limits<int64_t>::max() / 4 / config.block_size) {
    return absl::InvalidArgumentError("KV pool: too many tokens to remember for prefix caching");
  }
  return absl::WrapUnique(new KvPool(config));
}

KvPool::KvPool(const KvPoolConfig& config) : config_(config) {
  if (config_.block_hash == nullptr) config_.block_hash = ChainedBlockHash;
  blocks_.resize(static_cast<size_t>(config.num_blocks));
  free_list_.reserve(static_cast<size_t>(config.num_blocks));
  // Pop from the back hands out block 0 first.
  for (int64_t b = config.num_blocks - 1; b >= 0; --b) {
    free_list_.push_back(static_cast<int32_t>(b));
  }
  // The tokens are what a cache hit is confirmed against; without caching nothing reads them.
  if (config.prefix_caching)
    tokens_.resize(static_cast<size_t>(config.num_blocks * config.block_size));
}

KvPool::Sequence* KvPool::Find(SeqId seq) {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const KvPool::Sequence* KvPool::Find(SeqId seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

absl::Status KvPool::AddSequence(SeqId seq) {
  if (!seqs_.try_emplace(seq).second) {
    return absl::AlreadyExistsError(absl::StrCat("KV pool: sequence ", seq, " already exists"));
  }
  return absl::OkStatus();
}

absl::Status KvPool::Fork(SeqId parent, SeqId child) {
  const Sequence* p = Find(parent);
  if (p == nullptr) return Unknown(parent);
  if (Find(child) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("KV pool: sequence ", child, " already exists"));
  }
  const Sequence copy = *p;  // the emplace below may move *p
  for (const int32_t b : copy.blocks) Ref(b);
  seqs_.emplace(child, copy);
  return absl::OkStatus();
}

bool KvPool::Has(SeqId seq) const { return seqs_.contains(seq); }

absl::StatusOr<int64_t> KvPool::Length(SeqId seq) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  return s->length;
}

bool KvPool::Shared(int32_t block) const {
  const Block& b = blocks_[static_cast<size_t>(block)];
  return b.refs > 1 || b.serial != 0;
}

int32_t KvPool::Allocate() {
  if (!free_list_.empty()) {
    const int32_t b = free_list_.back();
    free_list_.pop_back();
    return b;
  }
  // Evict the cached block released longest ago.
  const int32_t b = evictable_.front();
  evictable_.pop_front();
  Block& block = blocks_[static_cast<size_t>(b)];
  cache_.erase(block.hash);
  block = Block();
  return b;
}

void KvPool::Ref(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.refs == 0 && b.serial != 0) evictable_.erase(b.lru);
  ++b.refs;
}

void KvPool::Unref(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (--b.refs > 0) return;
  if (b.serial != 0) {
    b.lru = evictable_.insert(evictable_.end(), block);
  } else {
    free_list_.push_back(block);
  }
}

std::span<int32_t> KvPool::TokensOf(int32_t block) {
  return std::span<int32_t>(tokens_).subspan(static_cast<size_t>(block * config_.block_size),
                                             static_cast<size_t>(config_.block_size));
}

std::span<const int32_t> KvPool::TokensOf(int32_t block) const {
  return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(block * config_.block_size),
                                                   static_cast<size_t>(config_.block_size));
}

uint64_t KvPool::Hash(uint64_t parent, std::span<const int32_t> tokens) const {
  return config_.block_hash(parent, tokens);
}

int32_t KvPool::Lookup(uint64_t hash, uint64_t parent_serial,
                       std::span<const int32_t> tokens) const {
  const auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  const int32_t b = it->second;
  // Confirmed by content: the same parent (by serial, which is never reused) and the same tokens.
  if (blocks_[static_cast<size_t>(b)].parent_serial != parent_serial) return -1;
  const std::span<const int32_t> cached = TokensOf(b);
  if (!std::equal(cached.begin(), cached.end(), tokens.begin(), tokens.end())) return -1;
  return b;
}

std::pair<uint64_t, uint64_t> KvPool::ParentOf(const Sequence& s, size_t index) const {
  if (index == 0) return {config_.cache_salt, 0};
  const Block& parent = blocks_[static_cast<size_t>(s.blocks[index - 1])];
  return {parent.hash, parent.serial};
}

absl::StatusOr<int64_t> KvPool::BlocksNeeded(SeqId seq, int64_t n_tokens) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  if (n_tokens <= 0) return 0;
  const int64_t new_len = n_tokens > std::numeric_limits<int64_t>::max() - s->length
                              ? std::numeric_limits<int64_t>::max()
                              : s->length + n_tokens;
  const bool copy = s->length % config_.block_size != 0 && Shared(s->blocks.back());
  return CeilDiv(new_len, config_.block_size) - static_cast<int64_t>(s->blocks.size()) +
         (copy ? 1 : 0);
}

absl::Status KvPool::Append(SeqId seq, std::span<const int32_t> tokens) {
  Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t max_len = config_.max_blocks_per_seq * config_.block_size;
  if (n > max_len - s->length) {
    return absl::OutOfRangeError(absl::StrCat("KV pool: sequence ", seq, " would reach ",
                                              s->length + n, " tokens, over the limit of ",
                                              max_len));
  }
  const int64_t need = *BlocksNeeded(seq, n);
  if (need > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV pool: sequence ", seq, " needs ", need, " more blocks to hold ", s->length + n,
        " tokens but only ", free_blocks(), " of ", total_blocks(), " are free"));
  }
  const int64_t bs = config_.block_size;
  const int64_t offset = s->length % bs;
  if (n > 0 && offset != 0 && Shared(s->blocks.back())) {
    // Copy on write; the source keeps this sequence's reference until the copy is confirmed.
    const int32_t src = s->blocks.back();
    const int32_t dst = Allocate();
    Ref(dst);
    if (config_.prefix_caching) {
      std::copy_n(TokensOf(src).begin(), offset, TokensOf(dst).begin());
    }
    s->blocks.back() = dst;
    pending_.push_back({seq, s->blocks.size() - 1, {src, dst, offset}});
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = s->length + i;
    if (pos % bs == 0) {
      const int32_t b = Allocate();
      Ref(b);
      s->blocks.push_back(b);
    }
    if (config_.prefix_caching)
      TokensOf(s->blocks.back())[static_cast<size_t>(pos % bs)] = tokens[i];
  }
  s->length += n;
  return absl::OkStatus();
}

std::vector<KvBlockCopy> KvPool::PendingCopies() const {
  std::vector<KvBlockCopy> out;
  out.reserve(pending_.size());
  for (const PendingCopy& p : pending_) out.push_back(p.copy);
  return out;
}

void KvPool::ConfirmCopies() {
  for (const PendingCopy& p : pending_) Unref(p.copy.src);
  pending_.clear();
}

void KvPool::RevertCopies() {
  for (auto p = pending_.rbegin(); p != pending_.rend(); ++p) {
    Sequence* s = Find(p->seq);
    if (s != nullptr && p->index < s->blocks.size() && s->blocks[p->index] == p->copy.dst) {
      s->blocks[p->index] = p->copy.src;  // the reference it kept
      Unref(p->copy.dst);
    } else {
      Unref(p->copy.src);
    }
  }
  pending_.clear();
}

absl::Status KvPool::Truncate(SeqId seq, int64_t new_len) {
  Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  if (new_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool: truncate length must be >= 0, got ", new_len));
  }
  s->length = std::min(s->length, new_len);
  const int64_t keep = CeilDiv(s->length, config_.block_size);
  while (static_cast<int64_t>(s->blocks.size()) > keep) {
    Unref(s->blocks.back());
    s->blocks.pop_back();
  }
  s->cached = std::min(s->cached, s->length / config_.block_size);
  return absl::OkStatus();
}

absl::Status KvPool::CheckCompaction(SeqId seq, int64_t tree_start,
                                     std::span<const int32_t> kept_nodes) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  const int64_t bs = config_.block_size;
  for (size_t i = 0; i < kept_nodes.size(); ++i) {
    const int64_t node = kept_nodes[i];
    const int64_t from = tree_start + node;
    const int64_t to = tree_start + static_cast<int64_t>(i);
    if (tree_start < 0 || node < static_cast<int64_t>(i) || from >= s->length ||
        (i > 0 && node <= kept_nodes[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV pool: cannot keep tree node ", node, " as entry ", i, " of a tree at slot ",
          tree_start, " of sequence ", seq, " (", s->length, " tokens; the nodes must increase)"));
    }
    if (from == to) continue;
    const int32_t block = s->blocks[static_cast<size_t>(to / bs)];
    if (Shared(block)) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV pool: slot ", to, " of sequence ", seq,
                       " lies in a block that is cached or held by another sequence"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvPool::CompactTokens(SeqId seq, int64_t tree_start,
                                   std::span<const int32_t> kept_nodes) {
  SPECD_RETURN_IF_ERROR(CheckCompaction(seq, tree_start, kept_nodes));
  if (!config_.prefix_caching) return absl::OkStatus();
  Sequence* s = Find(seq);
  const int64_t bs = config_.block_size;
  // In order: every source lies at or after its destination and after every earlier one.
  for (size_t i = 0; i < kept_nodes.size(); ++i) {
    const int64_t from = tree_start + kept_nodes[i];
    const int64_t to = tree_start + static_cast<int64_t>(i);
    TokensOf(s->blocks[static_cast<size_t>(to / bs)])[static_cast<size_t>(to % bs)] =
        TokensOf(s->blocks[static_cast<size_t>(from / bs)])[static_cast<size_t>(from % bs)];
  }
  return absl::OkStatus();
}

absl::Status KvPool::Release(SeqId seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Unknown(seq);
  // Last block first: a sequence's tail is the least likely part to be shared, so it is evicted
  // before its prefix.
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) Unref(*b);
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<const std::vector<int32_t>*> KvPool::BlockTable(SeqId seq) const {
  const Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  return &s->blocks;
}

absl::StatusOr<int64_t> KvPool::AttachCached(SeqId seq, std::span<const int32_t> tokens,
                                             int64_t max_tokens) {
  Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  const int64_t bs = config_.block_size;
  if (!config_.prefix_caching || s->length % bs != 0 ||
      s->cached != static_cast<int64_t>(s->blocks.size())) {
    return 0;
  }
  int64_t attached = 0;
  for (size_t at = 0; at + static_cast<size_t>(bs) <= tokens.size();
       at += static_cast<size_t>(bs)) {
    if (attached >= max_tokens ||
        static_cast<int64_t>(s->blocks.size()) >= config_.max_blocks_per_seq) {
      break;
    }
    const auto [parent_hash, parent_serial] = ParentOf(*s, s->blocks.size());
    const std::span<const int32_t> block = tokens.subspan(at, static_cast<size_t>(bs));
    const int32_t b = Lookup(Hash(parent_hash, block), parent_serial, block);
    if (b < 0) break;
    Ref(b);
    s->blocks.push_back(b);
    const int64_t take = std::min(bs, max_tokens - attached);
    attached += take;
    s->length += take;
    if (take < bs) break;  // partially attached: the next write copies it
    ++s->cached;
  }
  return attached;
}

absl::Status KvPool::CacheCommitted(SeqId seq, int64_t committed) {
  Sequence* s = Find(seq);
  if (s == nullptr) return Unknown(seq);
  if (!config_.prefix_caching) return absl::OkStatus();
  const int64_t full = std::min(committed, s->length) / config_.block_size;
  for (int64_t i = s->cached; i < full; ++i) {
    const size_t index = static_cast<size_t>(i);
    const int32_t b = s->blocks[index];
    const auto [parent_hash, parent_serial] = ParentOf(*s, index);
    Block& block = blocks_[static_cast<size_t>(b)];
    if (block.serial != 0) {
      if (block.parent_serial != parent_serial) break;  // not this sequence's chain
      s->cached = i + 1;
      continue;
    }
    const std::span<const int32_t> tokens = TokensOf(b);
    const uint64_t hash = Hash(parent_hash, tokens);
    if (const int32_t twin = Lookup(hash, parent_serial, tokens); twin >= 0) {
      // Computed twice (two sequences prefilled the same prefix at once): keep the cached one.
      Ref(twin);
      s->blocks[index] = twin;
      Unref(b);
      s->cached = i + 1;
      continue;
    }
    // A different block already has this hash: a collision. The rest of this chain stays
    // uncached rather than risk serving one block for the other.
    if (cache_.contains(hash)) break;
    block.serial = next_serial_++;
    block.parent_serial = parent_serial;
    block.hash = hash;
    cache_.emplace(hash, b);
    s->cached = i + 1;
  }
  return absl::OkStatus();
}

}  // namespace specd
