// IncrementalDetokenizer: the prefix/read offset technique of vLLM and TGI. Each push decodes a
// short window of earlier tokens plus the new ones and emits what the window adds to the text of
// its earlier tokens, so the work per push is proportional to the window, not to the stream.

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace specd {
namespace {

// Emitted ids are dropped from the front once this many pile up before the window.
constexpr size_t kTrimThreshold = 1024;
// Earlier emission points tried as the start of the next window; past these the window grows.
constexpr size_t kMaxWindowCandidates = 4;

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens), boundaries_{0} {}

absl::StatusOr<std::string> IncrementalDetokenizer::DecodeRange(size_t begin, size_t end) const {
  return tokenizer_.Decode(std::span<const int32_t>(ids_).subspan(begin, end - begin),
                           skip_special_tokens_);
}

absl::StatusOr<std::string> IncrementalDetokenizer::Push(std::span<const int32_t> ids) {
  // Validate first, so a bad id leaves the stream as it was.
  for (const int32_t id : ids) {
    if (const absl::StatusOr<std::string> piece = tokenizer_.IdToPiece(id); !piece.ok()) {
      return piece.status();
    }
  }
  for (const int32_t id : ids) {
    // A skipped special token contributes nothing to Decode, wherever it is (byte tokens on
    // both sides of it form one run).
    if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) continue;
    ids_.push_back(id);
  }
  if (read_offset_ == ids_.size()) return std::string();
  // A run of byte-fallback tokens decodes as a whole (an invalid run becomes one U+FFFD per
  // byte), so nothing is emitted until the run ends.
  if (tokenizer::ParseByteToken(*tokenizer_.IdToPiece(ids_.back())).has_value()) {
    return std::string();
  }
  SPECD_ASSIGN_OR_RETURN(std::string text, DecodeRange(prefix_offset_, ids_.size()));
  // A trailing U+FFFD may be an incomplete character that later tokens complete.
  if (text.size() <= prefix_text_.size() || !text.starts_with(prefix_text_) ||
      text.ends_with(tokenizer::kReplacementChar)) {
    return std::string();
  }
  std::string emitted = text.substr(prefix_text_.size());
  // The next window starts at the latest earlier emission point from which the tokens alone
  // decode to some text: a window whose leading tokens decode to nothing (a lone "▁" under
  // Strip, say) would let the decoder strip the first space of the new text, which the full
  // decode keeps.
  bool moved = false;
  for (size_t k = 0; k < kMaxWindowCandidates && k < boundaries_.size(); ++k) {
    const size_t b = boundaries_[boundaries_.size() - 1 - k];
    SPECD_ASSIGN_OR_RETURN(std::string window_text, DecodeRange(b, ids_.size()));
    if (window_text.empty()) continue;
    prefix_offset_ = b;
    prefix_text_ = std::move(window_text);
    boundaries_.erase(boundaries_.begin(), boundaries_.end() - static_cast<std::ptrdiff_t>(k + 1));
    moved = true;
    break;
  }
  if (!moved) prefix_text_ = std::move(text);
  boundaries_.push_back(ids_.size());
  read_offset_ = ids_.size();
  if (prefix_offset_ >= kTrimThreshold) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    for (size_t& b : boundaries_) b -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return emitted;
}

absl::Status IncrementalDetokenizer::Skip(std::span<const int32_t> ids) {
  // A byte-fallback run at the end stays out: it is the reader's text already, and decoded
  // together with the first bytes that follow it, it could change (an invalid run turns every
  // one of its bytes into U+FFFD) or be emitted again. The tokens before it are the context.
  size_t keep = ids.size();
  while (keep > 0) {
    absl::StatusOr<std::string> piece = tokenizer_.IdToPiece(ids[keep - 1]);
    if (!piece.ok()) return piece.status();
    if (!tokenizer::ParseByteToken(*piece).has_value()) break;
    --keep;
  }
  return Push(ids.first(keep)).status();
}

absl::StatusOr<std::string> IncrementalDetokenizer::Flush() {
  if (read_offset_ == ids_.size()) return std::string();
  SPECD_ASSIGN_OR_RETURN(std::string text, DecodeRange(prefix_offset_, ids_.size()));
  if (!text.starts_with(prefix_text_)) {
    return absl::InternalError(
        "IncrementalDetokenizer: the decoded window no longer starts with its emitted prefix");
  }
  std::string emitted = text.substr(prefix_text_.size());
  prefix_text_ = std::move(text);
  read_offset_ = ids_.size();
  boundaries_.push_back(read_offset_);
  return emitted;
}

}  // namespace specd
