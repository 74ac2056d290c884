// A deterministic SentencePiece-style BPE tokenizer for synthetic models, in the same
// tokenizer.json layout as Llama 2's, so synthetic checkpoints are complete model directories.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/synth/synth.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

constexpr char kSpace[] = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's visible space

// Counts code points; every piece here is ASCII apart from the leading "▁".
size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (const unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

}  // namespace

std::string SyntheticTokenizerJson(int64_t vocab_size) {
  using nlohmann::json;
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) pieces.push_back(absl::StrFormat("<0x%02X>", b));
  absl::flat_hash_set<std::string> seen(pieces.begin(), pieces.end());
  std::vector<std::string> letters;
  const std::string common = "etaoinshrdlucmfwypvbgkjqxz";
  for (const char ch : common) letters.emplace_back(1, ch);
  std::vector<std::string> base = {kSpace};
  for (int ch = 0x21; ch < 0x7f; ++ch) base.emplace_back(1, static_cast<char>(ch));
  for (const std::string& p : base) {
    if (static_cast<int64_t>(pieces.size()) >= vocab_size) break;
    if (seen.insert(p).second) pieces.push_back(p);
  }
  // Merges grow words from "▁" + letters, favouring frequent English letters, so that decoded
  // synthetic text reads as word-like strings.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> words = {kSpace};
  uint64_t state = 0x2545f4914f6cdd1dULL;
  auto next = [&state]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int64_t attempts = 0;
  while (static_cast<int64_t>(pieces.size()) < vocab_size) {
    ++attempts;
    const std::string& left = words[next() % words.size()];
    // Skewed letter choice: the square of a uniform index favours the front of `common`.
    const uint64_t r = next() % 1000;
    const std::string& right = letters[(r * r / 1000) * letters.size() / 1000];
    std::string merged = left + right;
    const bool fresh = CodePoints(merged) <= 12 && !seen.contains(merged);
    if (fresh) {
      seen.insert(merged);
      pieces.push_back(merged);
      merges.emplace_back(left, right);
      words.push_back(std::move(merged));
    } else if (attempts % 64 == 0) {
      // Rare fallback so that large vocabularies always complete: extend with a numbered piece.
      std::string piece = absl::StrFormat("%s%s%lld", kSpace, left.size() > 3 ? "w" : "v",
                                          static_cast<long long>(pieces.size()));
      if (seen.insert(piece).second) {
        // Numbered pieces are reachable only by id (no merge), which is fine for a random model.
        pieces.push_back(std::move(piece));
      }
    }
  }

  json vocab = json::object();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = static_cast<int64_t>(i);
  json merge_list = json::array();
  for (const auto& [a, b] : merges) merge_list.push_back(a + " " + b);
  json added = json::array();
  for (int id = 0; id < 3; ++id) {
    added.push_back({{"id", id},
                     {"content", pieces[static_cast<size_t>(id)]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", kSpace}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}};
  j["pre_tokenizer"] = nullptr;
  json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {bos,
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        bos,
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  return j.dump() + "\n";
}

}  // namespace specd
