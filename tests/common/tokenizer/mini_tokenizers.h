// Small hand-checkable tokenizer.json documents for the unit tests: a SentencePiece-style BPE
// (Llama 2's layout) and a byte-level BPE (Llama 3's layout) over a handful of merges, so every
// expected id in the tests can be worked out by hand.
#ifndef SPECD_TESTS_COMMON_TOKENIZER_MINI_TOKENIZERS_H_
#define SPECD_TESTS_COMMON_TOKENIZER_MINI_TOKENIZERS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace specd::testing {

inline constexpr char kSpm[] = "\xE2\x96\x81";  // "▁"

// Llama 2 layout. Ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then
// 259 ▁, 260 t, 261 h, 262 e, 263 a, 264 c, 265 ▁t, 266 he, 267 ▁the, 268 ca, 269 ▁ca, 270 ▁▁,
// 271 é. Merges by rank: (▁,t) (h,e) (▁t,he) (c,a) (▁,ca) (▁,▁).
inline nlohmann::json MiniSpmTokenizerJson() {
  using nlohmann::json;
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[absl::StrFormat("<0x%02X>", b)] = 3 + b;
  const std::string s = kSpm;
  const std::vector<std::string> pieces = {
      s, "t", "h", "e", "a", "c", s + "t", "he", s + "the", "ca", s + "ca", s + s, "\xC3\xA9"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = 259 + static_cast<int>(i);
  const json merges = {s + " t", "h e", s + "t he", "c a", s + " ca", s + " " + s};
  const auto special = [](int id, const char* content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  const json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", {special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")}},
              {"normalizer",
               {{"type", "Sequence"},
                {"normalizers",
                 {{{"type", "Prepend"}, {"prepend", s}},
                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", s}}}}}},
              {"pre_tokenizer", nullptr},
              {"post_processor",
               {{"type", "TemplateProcessing"},
                {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                {"pair", json::array()},
                {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
              {"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {{{"type", "Replace"}, {"pattern", {{"String", s}}}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"vocab", vocab},
                {"merges", merges}}}};
}

inline constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// GPT-2's byte-to-character mapping, written out independently of the library's table.
inline std::string ByteChar(int b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int i = 0; i < b; ++i) {
      const bool p = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
      cp += p ? 0 : 1;
    }
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// Llama 3 layout. Ids 0..255: the byte-level character of byte b has id b. Then 256 Ġt
// (" t"), 257 he, 258 Ġthe (" the"), 259 Ã¤ ("ä" = C3 A4), 260 ĠĠ ("  "), 261 hello.
// Merges by rank: (Ġ,t) (h,e) (Ġt,he) (Ã,¤) (Ġ,Ġ) (he,l) ... "hello" is reachable only through
// ignore_merges. Added: 300 <|begin_of_text|>, 301 <|eot_id|> (special), 302 "[x]" (not special).
inline nlohmann::json MiniByteLevelTokenizerJson() {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::string g = ByteChar(' ');
  vocab[g + "t"] = 256;
  vocab["he"] = 257;
  vocab[g + "the"] = 258;
  vocab[ByteChar(0xC3) + ByteChar(0xA4)] = 259;
  vocab[g + g] = 260;
  vocab["hello"] = 261;
  vocab["hel"] = 262;
  const json merges =
      json::array({json::array({g, "t"}), json::array({"h", "e"}), json::array({g + "t", "he"}),
                   json::array({ByteChar(0xC3), ByteChar(0xA4)}), json::array({g, g}),
                   json::array({"he", "l"})});
  const auto added = [](int id, const char* content, bool special) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens",
               {added(300, "<|begin_of_text|>", true), added(301, "<|eot_id|>", true),
                added(302, "[x]", false)}},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", kLlama3Pattern}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}}}}}},
              {"post_processor",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", false},
                {"use_regex", true}}},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", true},
                {"vocab", vocab},
                {"merges", merges}}}};
}

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_TOKENIZER_MINI_TOKENIZERS_H_
