// What the fuzzers assert with. A failed check traps, which libFuzzer reports as a crash, with
// the input that caused it saved as an artifact.
#ifndef SPECD_TESTS_FUZZ_FUZZ_UTIL_H_
#define SPECD_TESTS_FUZZ_FUZZ_UTIL_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/tokenizer/mini_tokenizers.h"

namespace specd::fuzz {

inline void Check(bool condition) {
  if (!condition) __builtin_trap();
}

// How bad input must be refused: INVALID_ARGUMENT, with a message for a person.
inline void CheckRefusal(const absl::Status& status) {
  Check(status.code() == absl::StatusCode::kInvalidArgument && !status.message().empty());
}

// The small SentencePiece-style tokenizer of the tokenizer tests, loaded once.
inline const Tokenizer& MiniTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::FromJson(testing::MiniSpmTokenizerJson().dump(), "", "");
    Check(t.ok());
    return *std::move(t);
  }();
  return *tokenizer;
}

}  // namespace specd::fuzz

#endif  // SPECD_TESTS_FUZZ_FUZZ_UTIL_H_
