// Pre-tokenizer regular expressions on PCRE2 (UTF + UCP, JIT), matching the way Hugging Face's
// tokenizers runs them through Oniguruma.
#ifndef SPECD_COMMON_TOKENIZER_REGEX_H_
#define SPECD_COMMON_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd::tokenizer {

class Regex {
 public:
  // `what` names the pattern's origin for errors, e.g. "tokenizer.json: pre_tokenizer (Split)".
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern,
                                                        std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of successive matches in valid UTF-8 `text`, iterating
  // as Oniguruma's find_iter does (an empty match right after the previous match is skipped).
  absl::Status FindAll(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  Regex(std::string pattern, std::unique_ptr<Impl> impl);

  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// Rewrites \s and \S to Unicode White_Space (what Oniguruma and Rust mean by them); PCRE2's UCP
// \s also matches U+180E. Exposed for tests.
std::string TranslateWhitespaceClasses(std::string_view pattern);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_REGEX_H_
