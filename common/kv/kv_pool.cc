#include "common/kv/kv_pool.h"

#include <algorithm>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "base/math.h"

namespace specd {
namespace {

// Block ids are int32 in block tables; stay well inside that and inside host memory for tables.
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

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
  return absl::WrapUnique(new KvPool(config));
}

KvPool::KvPool(const KvPoolConfig& config) : config_(config) {
  free_list_.reserve(static_cast<size_t>(config.num_blocks));
  // Pop from the back hands out block 0 first.
  for (int64_t b = config.num_blocks - 1; b >= 0; --b) {
    free_list_.push_back(static_cast<int32_t>(b));
  }
}

absl::Status KvPool::AddSequence(SeqId seq) {
  if (!seqs_.try_emplace(seq).second) {
    return absl::AlreadyExistsError(absl::StrCat("KV pool: sequence ", seq, " already exists"));
  }
  return absl::OkStatus();
}

bool KvPool::Has(SeqId seq) const { return seqs_.contains(seq); }

absl::StatusOr<int64_t> KvPool::Length(SeqId seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
  }
  return it->second.length;
}

absl::StatusOr<int64_t> KvPool::BlocksNeeded(SeqId seq, int64_t new_len) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
  }
  const int64_t have = static_cast<int64_t>(it->second.blocks.size());
  return std::max<int64_t>(0, CeilDiv(std::max<int64_t>(new_len, 0), config_.block_size) - have);
}

absl::Status KvPool::Extend(SeqId seq, int64_t new_len) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
  }
  Sequence& s = it->second;
  if (new_len < s.length) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool: cannot extend sequence ", seq,
                                                   " from ", s.length, " down to ", new_len));
  }
  const int64_t max_len = config_.max_blocks_per_seq * config_.block_size;
  if (new_len > max_len) {
    return absl::OutOfRangeError(absl::StrCat("KV pool: sequence ", seq, " would reach ", new_len,
                                              " tokens, over the limit of ", max_len));
  }
  const int64_t need = CeilDiv(new_len, config_.block_size) - static_cast<int64_t>(s.blocks.size());
  if (need > free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool: sequence ", seq, " needs ", need, " more blocks to hold ", new_len,
                     " tokens but only ", free_blocks(), " of ", total_blocks(), " are free"));
  }
  for (int64_t i = 0; i < need; ++i) {
    s.blocks.push_back(free_list_.back());
    free_list_.pop_back();
  }
  s.length = new_len;
  return absl::OkStatus();
}

absl::Status KvPool::Truncate(SeqId seq, int64_t new_len) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
  }
  if (new_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool: truncate length must be >= 0, got ", new_len));
  }
  Sequence& s = it->second;
  s.length = std::min(s.length, new_len);
  const int64_t keep = CeilDiv(s.length, config_.block_size);
  while (static_cast<int64_t>(s.blocks.size()) > keep) {
    free_list_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
  return absl::OkStatus();
}

absl::Status KvPool::Release(SeqId seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
  }
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) {
    free_list_.push_back(*b);
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<const std::vector<int32_t>*> KvPool::BlockTable(SeqId seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV pool: unknown sequence ", seq));
  }
  return &it->second.blocks;
}

}  // namespace specd
