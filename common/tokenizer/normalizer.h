// The normalizers Llama tokenizers declare: Prepend and Replace (string pattern), applied in order
// (a Sequence is flattened at load).
#ifndef SPECD_COMMON_TOKENIZER_NORMALIZER_H_
#define SPECD_COMMON_TOKENIZER_NORMALIZER_H_

#include <string>
#include <string_view>
#include <vector>

namespace specd::tokenizer {

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace };
  Kind kind;
  std::string prepend;  // kPrepend: added in front of every non-empty string
  std::string pattern;  // kReplace: every non-overlapping occurrence, left to right ...
  std::string content;  // ... becomes this
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  // `prepend` false skips the Prepend steps (a continuation's start).
  std::string Apply(std::string_view text, bool prepend = true) const;
  // A canonical description for the tokenizer fingerprint.
  std::string Describe() const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_NORMALIZER_H_
