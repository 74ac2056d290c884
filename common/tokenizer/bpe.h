// The BPE model of Hugging Face's tokenizers: merges by rank with a priority queue over a linked
// list of symbols, byte fallback or an unknown token for characters outside the vocabulary, and
// ignore_merges (a word that is itself in the vocabulary maps straight to its id).
#ifndef SPECD_COMMON_TOKENIZER_BPE_H_
#define SPECD_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace specd::tokenizer {

struct BpeOptions {
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;
  // Words arrive as raw bytes rather than GPT-2 byte-level characters: the vocabulary is re-keyed
  // by the bytes each piece stands for, so the pre-tokenizer need not map every byte.
  bool raw_byte_input = false;
  // Memoise word -> ids (worth it when a pre-tokenizer splits text into short, repeating words).
  bool cache_words = false;
  // SentencePiece-style vocabularies have no pre-tokenizer, so a whole prompt is one word. When
  // this character is in the vocabulary and every merge result is a run of it followed by text
  // without it ("▁▁the"), no merge can cross the position before an occurrence that follows
  // another character, and a word is tokenized in chunks that start there (with the cache) with
  // exactly the same result, in linear rather than O(n log n) time on one large heap.
  std::string chunk_before;
};

class BpeModel {
 public:
  // `vocab` maps pieces to ids; `merges` lists piece pairs by rank (first = merged first).
  // `where` names the source in errors (e.g. "tokenizer.json: model").
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const absl::flat_hash_map<std::string, int32_t>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options,
      std::string_view where);

  // Appends the ids of one pre-tokenized word.
  absl::Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  // Whether words are tokenized in chunks (see BpeOptions::chunk_before), for tests.
  bool chunks_words() const { return !chunk_before_.empty(); }

  // The merges in effect, as (left id, right id) in rank order, for the fingerprint.
  std::vector<std::pair<int32_t, int32_t>> RankedMerges() const;

 private:
  struct MergeValue {
    int32_t rank;
    int32_t new_id;
  };

  explicit BpeModel(const BpeOptions& options) : options_(options) {}

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::optional<int32_t> Lookup(std::string_view piece) const;
  // Appends the initial symbols of `word` (one per character, or per byte with raw input).
  absl::Status InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  void MergeAll(std::vector<int32_t>* symbols) const;
  absl::Status TokenizeChunk(std::string_view chunk, std::vector<int32_t>* ids) const;

  BpeOptions options_;
  std::string chunk_before_;  // empty unless chunking is exact for this vocabulary
  absl::flat_hash_map<std::string, int32_t> vocab_;  // keyed by raw bytes with raw_byte_input
  absl::flat_hash_map<uint64_t, MergeValue> merges_;
  std::array<int32_t, 256> single_byte_ids_;    // id of the one-character (or byte) piece, or -1
  std::array<int32_t, 256> fallback_byte_ids_;  // id of "<0xXX>", or -1

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_BPE_H_
