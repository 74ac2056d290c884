#include "common/tokenizer/text_output.h"

#include <algorithm>

namespace specd {

TextOutput::TextOutput(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
                       std::span<const int32_t> prompt)
    : stops_(std::move(stop_strings)) {
  if (tokenizer != nullptr) {
    detok_ = std::make_unique<IncrementalDetokenizer>(*tokenizer, /*skip_special_tokens=*/true);
    // The prompt's own text is the client's; only what follows it is streamed (a chat prompt
    // often ends in a byte token, "\n" under SentencePiece, which Push alone would hold back
    // and then stream with the first reply token).
    (void)detok_->Skip(prompt);
  }
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

size_t TextOutput::HeldBack() const {
  size_t held = 0;
  for (const std::string& stop : stops_) {
    const size_t max = std::min(stop.size() - 1, pending_.size());
    for (size_t n = max; n > held; --n) {
      if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
        held = n;
        break;
      }
    }
  }
  return held;
}

absl::StatusOr<TextOutput::Chunk> TextOutput::Push(std::span<const int32_t> ids) {
  Chunk chunk;
  if (stopped_ || detok_ == nullptr) {
    chunk.tokens_used = stopped_ ? 0 : ids.size();
    chunk.stopped = stopped_;
    return chunk;
  }
  for (const int32_t id : ids) {
    absl::StatusOr<std::string> piece = detok_->Push(std::span<const int32_t>(&id, 1));
    if (!piece.ok()) return piece.status();
    ++chunk.tokens_used;
    // Only the new text and the held-back tail can hold a newly completed stop string.
    const size_t search_from = pending_.size();
    pending_ += *piece;
    size_t earliest = std::string::npos;
    for (const std::string& stop : stops_) {
      const size_t from = search_from >= stop.size() ? search_from - stop.size() + 1 : 0;
      const size_t at = pending_.find(stop, from);
      earliest = std::min(earliest, at);
    }
    if (earliest != std::string::npos) {
      chunk.text += pending_.substr(0, earliest);
      pending_.clear();
      chunk.stopped = stopped_ = true;
      return chunk;
    }
  }
  const size_t send = pending_.size() - HeldBack();
  chunk.text += pending_.substr(0, send);
  pending_.erase(0, send);
  return chunk;
}

absl::StatusOr<std::string> TextOutput::Finish() {
  if (stopped_ || detok_ == nullptr) return std::string();
  absl::StatusOr<std::string> tail = detok_->Flush();
  if (!tail.ok()) return tail.status();
  std::string out = std::move(pending_) + *tail;
  pending_.clear();
  // The detokenizer may hold bytes back to the very end (an unfinished UTF-8 sequence): a stop
  // string can complete only here.
  size_t earliest = std::string::npos;
  for (const std::string& stop : stops_) earliest = std::min(earliest, out.find(stop));
  if (earliest != std::string::npos) {
    out.resize(earliest);
    stopped_ = true;
  }
  return out;
}

}  // namespace specd
