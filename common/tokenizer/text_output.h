// Turns a request's generated tokens into streamed text: incremental detokenization, then stop
// strings that may straddle token boundaries. Text that could still be the start of a stop string
// is held back until it cannot be; a completed stop string ends the request and is trimmed.
#ifndef SPECD_COMMON_TOKENIZER_TEXT_OUTPUT_H_
#define SPECD_COMMON_TOKENIZER_TEXT_OUTPUT_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace specd {

class TextOutput {
 public:
  // `tokenizer` may be null (token-id-only models): then text is always empty and stop strings
  // are not allowed. The prompt primes the detokenizer, so the first generated piece is a
  // continuation (e.g. SentencePiece keeps its leading space) rather than the start of a text.
  TextOutput(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
             std::span<const int32_t> prompt);

  struct Chunk {
    std::string text;        // safe to send now
    bool stopped = false;    // a stop string completed; text ends right before it
    size_t tokens_used = 0;  // how many of the pushed ids were consumed before stopping
  };

  // Feeds new ids one at a time, so that a stop string is found at the exact token.
  absl::StatusOr<Chunk> Push(std::span<const int32_t> ids);
  // End of generation: everything held back, cut at a stop string that completes in it.
  absl::StatusOr<std::string> Finish();
  bool stopped() const { return stopped_; }

 private:
  // Length of the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t HeldBack() const;

  std::unique_ptr<IncrementalDetokenizer> detok_;
  std::vector<std::string> stops_;
  std::string pending_;  // detokenized but not yet sent
  bool stopped_ = false;
};

}  // namespace specd

#endif  // SPECD_COMMON_TOKENIZER_TEXT_OUTPUT_H_
