// Added tokens (tokenizer.json "added_tokens"): found in the input before normalization and
// pre-tokenization, with Hugging Face's leftmost-longest matching and the single_word, lstrip and
// rstrip rules. Special tokens are found only when the caller asks (EncodeOptions.parse_special);
// non-special added tokens are always found, as Hugging Face always splits on them.
#ifndef SPECD_COMMON_TOKENIZER_ADDED_TOKENS_H_
#define SPECD_COMMON_TOKENIZER_ADDED_TOKENS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace specd::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = true;    // matched in normalized text rather than the raw input
  bool lstrip = false;       // takes the whitespace on its left
  bool rstrip = false;       // takes the whitespace on its right
  bool single_word = false;  // only matches when not inside a word
};

// A slice of the text being split: plain text, or an added token.
struct Segment {
  size_t begin;
  size_t end;
  int32_t token_id;  // -1 for plain text
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Each entry is a pattern and the token it stands for; `tokens` must outlive the matcher.
  explicit AddedTokenMatcher(std::vector<std::pair<std::string, const AddedToken*>> entries);

  bool empty() const { return entries_.empty(); }

  // Splits `text` into segments covering it; empty text gives no segment.
  void Split(std::string_view text, bool parse_special, std::vector<Segment>* out) const;

 private:
  // Index of the longest pattern that starts at `pos`, or -1.
  int32_t LongestMatchAt(std::string_view text, size_t pos) const;

  std::vector<std::pair<std::string, const AddedToken*>> entries_;
  // Trie over pattern bytes: (node << 8 | byte) -> child node.
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;  // per node: entry index ending here, or -1
  bool first_byte_[256] = {};
};

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_ADDED_TOKENS_H_
