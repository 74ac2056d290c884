#include "common/tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/string_util.h"
#include "common/tokenizer/utf8.h"

namespace specd::tokenizer {
namespace {

// Words longer than this rarely repeat, and a bounded cache never needs eviction.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kCacheCapacity = 1 << 16;

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

struct MergeCandidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// Lowest rank first, then leftmost position, as Hugging Face's Word::merge_all orders its heap.
struct LaterCandidate {
  bool operator()(const MergeCandidate& a, const MergeCandidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const absl::flat_hash_map<std::string, int32_t>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options,
    std::string_view where) {
  auto model = std::unique_ptr<BpeModel>(new BpeModel(options));
  model->single_byte_ids_.fill(-1);
  model->fallback_byte_ids_.fill(-1);
  model->vocab_.reserve(vocab.size());
  for (const auto& [piece, id] : vocab) {
    if (options.raw_byte_input) {
      // Pieces with a character outside the byte-level alphabet can never match a mapped word.
      if (std::optional<std::string> bytes = ByteLevelDecode(piece)) {
        model->vocab_.emplace(*std::move(bytes), id);
      }
    } else {
      model->vocab_.emplace(piece, id);
    }
  }
  for (int b = 0; b < 256; ++b) {
    const std::string key = options.raw_byte_input
                                ? std::string(1, static_cast<char>(b))
                                : (b < 0x80 ? std::string(1, static_cast<char>(b)) : "");
    if (!key.empty()) {
      if (const auto it = model->vocab_.find(key); it != model->vocab_.end()) {
        model->single_byte_ids_[b] = it->second;
      }
    }
    // Exactly the spelling Hugging Face's byte fallback looks up: uppercase hex digits.
    if (const auto it = vocab.find(absl::StrFormat("<0x%02X>", b)); it != vocab.end()) {
      model->fallback_byte_ids_[b] = it->second;
    }
  }

  const auto id_of = [&](std::string_view piece) -> std::optional<int32_t> {
    const auto it = vocab.find(ToAbsl(piece));
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  };
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::optional<int32_t> a = id_of(left);
    const std::optional<int32_t> b = id_of(right);
    const std::optional<int32_t> merged = id_of(absl::StrCat(left, right));
    if (!a || !b || !merged) {
      const std::string merged_piece = absl::StrCat(left, right);
      const std::string& missing_piece = !a ? left : !b ? right : merged_piece;
      const char* missing = !a ? "left part" : !b ? "right part" : "merged token";
      return absl::InvalidArgumentError(absl::StrCat(ToAbsl(where), ": merges[", rank, "] ('", left,
                                                     "', '", right, "'): the ", missing, " '",
                                                     missing_piece, "' is not in the vocabulary"));
    }
    // A repeated pair keeps its last rank, as Hugging Face's map construction does.
    model->merges_.insert_or_assign(PairKey(*a, *b),
                                    MergeValue{static_cast<int32_t>(rank), *merged});
  }
  const std::string& c = options.chunk_before;
  if (!c.empty() && !options.raw_byte_input && vocab.contains(ToAbsl(c))) {
    bool chunkable = true;
    for (const auto& [left, right] : merges) {
      const std::string merged = absl::StrCat(left, right);
      size_t lead = 0;
      while (merged.compare(lead, c.size(), c) == 0) lead += c.size();
      chunkable &= merged.find(c, lead) == std::string::npos;
    }
    if (chunkable) model->chunk_before_ = c;
  }
  return model;
}

std::optional<int32_t> BpeModel::Lookup(std::string_view piece) const {
  const auto it = vocab_.find(ToAbsl(piece));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<int32_t, int32_t>> BpeModel::RankedMerges() const {
  std::vector<std::pair<int32_t, std::pair<int32_t, int32_t>>> by_rank;
  by_rank.reserve(merges_.size());
  for (const auto& [key, value] : merges_) {
    by_rank.push_back(
        {value.rank, {static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xFFFFFFFF)}});
  }
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::pair<int32_t, int32_t>> out;
  out.reserve(by_rank.size());
  for (const auto& [rank, pair] : by_rank) out.push_back(pair);
  return out;
}

absl::Status BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  // A run of unknown characters is pending here so that fuse_unk can merge it into one token.
  bool unk_pending = false;
  const auto flush_unk = [&] {
    if (unk_pending) symbols->push_back(*options_.unk_id);
    unk_pending = false;
  };
  size_t pos = 0;
  while (pos < word.size()) {
    const uint8_t lead = static_cast<uint8_t>(word[pos]);
    std::string_view ch;
    std::optional<int32_t> id;
    if (options_.raw_byte_input) {
      ch = word.substr(pos, 1);
      pos += 1;
      if (single_byte_ids_[lead] >= 0) id = single_byte_ids_[lead];
    } else {
      const size_t len = lead < 0x80 ? 1 : std::max<size_t>(1, ValidUtf8SequenceLength(word, pos));
      ch = word.substr(pos, len);
      pos += len;
      if (len == 1 && lead < 0x80) {
        if (single_byte_ids_[lead] >= 0) id = single_byte_ids_[lead];
      } else {
        id = Lookup(ch);
      }
    }
    if (id) {
      flush_unk();
      symbols->push_back(*id);
      continue;
    }
    // With raw input the character the vocabulary knows is the byte's mapped one.
    const std::string mapped =
        options_.raw_byte_input ? std::string(ByteLevelChar(lead)) : std::string(ch);
    if (options_.byte_fallback) {
      bool all_known = true;
      for (const char c : mapped) all_known &= fallback_byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_known) {
        // As in Hugging Face, byte tokens do not flush a pending unknown token first.
        for (const char c : mapped) symbols->push_back(fallback_byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (!options_.unk_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("the character '", absl::CHexEscape(mapped),
                       "' is not in the vocabulary and the model has no unk_token"));
    }
    if (!options_.fuse_unk) flush_unk();
    unk_pending = true;
  }
  flush_unk();
  return absl::OkStatus();
}

void BpeModel::MergeAll(std::vector<int32_t>* ids) const {
  const int32_t n = static_cast<int32_t>(ids->size());
  if (n < 2) return;
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {(*ids)[i], i - 1, i + 1 < n ? i + 1 : -1, false};
  std::vector<MergeCandidate> storage;
  storage.reserve(n);
  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, LaterCandidate> queue(
      LaterCandidate(), std::move(storage));
  const auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const MergeCandidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    const int32_t right_pos = left.next;
    // A stale entry: the pair at this position changed since it was queued.
    const auto it = merges_.find(PairKey(left.id, symbols[right_pos].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    Symbol& right = symbols[right_pos];
    left.id = top.new_id;
    left.next = right.next;
    right.removed = true;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  ids->clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

absl::Status BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (chunk_before_.empty()) return TokenizeChunk(word, ids);
  const std::string_view c = chunk_before_;
  size_t start = 0;
  while (start < word.size()) {
    // The next occurrence of c that follows another character starts the next chunk.
    size_t next = word.find(c, start + 1);
    while (next != std::string_view::npos && next >= c.size() &&
           word.substr(next - c.size(), c.size()) == c) {
      next = word.find(c, next + c.size());
    }
    if (next == std::string_view::npos) next = word.size();
    if (const absl::Status s = TokenizeChunk(word.substr(start, next - start), ids); !s.ok()) {
      return s;
    }
    start = next;
  }
  return absl::OkStatus();
}

absl::Status BpeModel::TokenizeChunk(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    if (const std::optional<int32_t> id = Lookup(word)) {
      ids->push_back(*id);
      return absl::OkStatus();
    }
  }
  const bool cacheable =
      (options_.cache_words || !chunk_before_.empty()) && word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (const auto it = cache_.find(ToAbsl(word)); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  if (const absl::Status s = InitialSymbols(word, &symbols); !s.ok()) return s;
  MergeAll(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(symbols));
  }
  return absl::OkStatus();
}

}  // namespace specd::tokenizer
