#include "common/tokenizer/added_tokens.h"

#include <memory>

#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"

namespace specd::tokenizer {
namespace {

// Rust's regex \w (Unicode), which Hugging Face uses for single_word.
bool IsWordChar(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  static const Regex* const word = [] {
    absl::StatusOr<std::unique_ptr<Regex>> r = Regex::Compile(
        "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]", "single_word character class");
    return r.ok() ? r->release() : nullptr;
  }();
  if (word == nullptr) return false;
  std::string s;
  AppendUtf8(cp, &s);
  std::vector<std::pair<size_t, size_t>> matches;
  return word->FindAll(s, &matches).ok() && !matches.empty();
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<std::pair<std::string, const AddedToken*>> entries)
    : entries_(std::move(entries)) {
  terminal_.push_back(-1);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const std::string& pattern = entries_[i].first;
    if (pattern.empty()) continue;
    first_byte_[static_cast<uint8_t>(pattern[0])] = true;
    int32_t node = 0;
    for (const char c : pattern) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      const auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    // The first of two identical patterns wins, like the order Aho-Corasick reports them.
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(i);
  }
}

int32_t AddedTokenMatcher::LongestMatchAt(std::string_view text, size_t pos) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]);
    const auto it = edges_.find(key);
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = terminal_[node];
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              std::vector<Segment>* out) const {
  if (entries_.empty()) {
    if (!text.empty()) out->push_back({0, text.size(), -1});
    return;
  }
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    const int32_t index = LongestMatchAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = *entries_[index].second;
    size_t start = pos;
    size_t stop = pos + entries_[index].first.size();
    pos = stop;  // the search resumes after this match whether or not it is used
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      size_t unused = 0;
      const bool word_before = start > 0 && IsWordChar(DecodeUtf8Backward(text, start, &unused));
      size_t after = stop;
      const bool word_after = stop < text.size() && IsWordChar(DecodeUtf8(text, &after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > emitted) {
        size_t prev = 0;
        if (!IsUnicodeWhiteSpace(DecodeUtf8Backward(text, s, &prev))) break;
        s = prev;
      }
      start = s;
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!IsUnicodeWhiteSpace(DecodeUtf8(text, &next))) break;
        stop = next;
      }
      pos = stop;
    }
    if (emitted < start) out->push_back({emitted, start, -1});
    out->push_back({start, stop, token.id});
    emitted = stop;
  }
  if (emitted < text.size()) out->push_back({emitted, text.size(), -1});
}

}  // namespace specd::tokenizer
