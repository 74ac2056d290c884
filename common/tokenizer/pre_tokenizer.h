// Pre-tokenizers: Split (regex, Isolated), ByteLevel and Metaspace, applied in order (a Sequence is
// flattened at load). Each step splits every piece further and may rewrite it.
#ifndef SPECD_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define SPECD_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/regex.h"

namespace specd::tokenizer {

// A piece of text on its way to the model. Pieces view strings owned by the input or by a
// PieceArena, so splitting never copies.
struct Piece {
  std::string_view text;
  // Whether the piece starts at offset 0 of the original input (Metaspace's "first" scheme).
  bool at_start = false;
  // Whether it starts a continuation (EncodeOptions::continuation): Metaspace prepends nothing.
  bool continues = false;
};

// Owns strings that pre-tokenizers rewrite; references stay valid as it grows.
class PieceArena {
 public:
  std::string_view Store(std::string s) { return strings_.emplace_back(std::move(s)); }

 private:
  std::deque<std::string> strings_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;  // kSplit; kByteLevel with use_regex (GPT-2's pattern)
  bool add_prefix_space = false;       // kByteLevel
  std::string replacement;             // kMetaspace, e.g. "▁"
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
  bool split = true;                                      // kMetaspace
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }

  // When the last step is ByteLevel, the model can take raw bytes instead of mapped characters
  // (the vocabulary is re-keyed at load), which saves the mapping on the hot path.
  bool ends_with_byte_level() const {
    return !steps_.empty() && steps_.back().kind == PreTokenizerStep::Kind::kByteLevel;
  }

  // Splits `pieces` in place. With `raw_bytes_out` the final ByteLevel step skips its byte to
  // character mapping.
  absl::Status Apply(std::vector<Piece>* pieces, PieceArena* arena, bool raw_bytes_out) const;

  std::string Describe() const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

// GPT-2's pattern, used by ByteLevel when use_regex is true.
inline constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_PRE_TOKENIZER_H_
