#include "common/tokenizer/llama2c_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/string_util.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁", SentencePiece's visible space
constexpr int32_t kFirstByteId = 3;
constexpr int32_t kNumReserved = kFirstByteId + 256;

struct Token {
  std::string piece;
  float score;
};

// Little-endian reads; the format is written by llama2.c's export on little-endian machines.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool ReadInt32(int32_t* v) { return Read(v, 4); }
  bool ReadFloat(float* v) { return Read(v, 4); }
  bool ReadBytes(size_t n, std::string_view* out) {
    if (bytes_.size() - pos_ < n) return false;
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  bool Read(void* v, size_t n) {
    if (bytes_.size() - pos_ < n) return false;
    uint8_t raw[4];
    std::memcpy(raw, bytes_.data() + pos_, n);
    const uint32_t u = uint32_t{raw[0]} | (uint32_t{raw[1]} << 8) | (uint32_t{raw[2]} << 16) |
                       (uint32_t{raw[3]} << 24);
    std::memcpy(v, &u, 4);
    pos_ += n;
    return true;
  }

  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::StatusOr<std::vector<Token>> ReadTokens(std::string_view bytes, int32_t vocab_size,
                                              std::string_view name) {
  const auto invalid = [&](const auto&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(name), ": ", parts...));
  };
  if (vocab_size < kNumReserved) {
    return invalid("vocab_size ", vocab_size, " is too small: llama2.c tokenizers have ",
                   kNumReserved, " reserved tokens (<unk>, <s>, </s> and 256 bytes)");
  }
  Reader reader(bytes);
  int32_t max_token_length = 0;
  if (!reader.ReadInt32(&max_token_length)) {
    return invalid("truncated: the file is ", bytes.size(),
                   " bytes, too short for the max_token_length header");
  }
  if (max_token_length <= 0 || max_token_length > (1 << 20)) {
    return invalid("max_token_length ", max_token_length, " is not a plausible length");
  }
  std::vector<Token> tokens;
  // vocab_size comes from the checkpoint, so it is untrusted: reserve no more tokens than the
  // bytes could hold (8 bytes of score and length each) rather than gigabytes for a bad value.
  tokens.reserve(std::min(static_cast<size_t>(vocab_size), reader.remaining() / 8));
  for (int32_t id = 0; id < vocab_size; ++id) {
    const size_t offset = reader.pos();
    float score = 0;
    int32_t length = 0;
    if (!reader.ReadFloat(&score) || !reader.ReadInt32(&length)) {
      return invalid("truncated at byte ", offset, ": token ", id, " of ", vocab_size,
                     " is missing (is vocab_size too large?)");
    }
    if (length < 0 || length > max_token_length) {
      return invalid("token ", id, " at byte ", offset, " has length ", length,
                     ", outside 0..max_token_length (", max_token_length, ")");
    }
    std::string_view piece;
    if (!reader.ReadBytes(static_cast<size_t>(length), &piece)) {
      return invalid("truncated at byte ", reader.pos(), ": token ", id, " needs ", length,
                     " bytes, ", reader.remaining(), " remain");
    }
    if (!std::isfinite(score)) return invalid("token ", id, " has a non-finite score");
    if (const absl::Status s =
            tokenizer::ValidateUtf8(piece, absl::StrCat(ToAbsl(name), ": token ", id));
        !s.ok()) {
      return s;
    }
    tokens.push_back({std::string(piece), score});
  }
  if (reader.remaining() != 0) {
    return invalid(reader.remaining(), " bytes follow the ", vocab_size,
                   " tokens (is vocab_size too small?)");
  }
  return tokens;
}

// The piece each id stands for in tokenizer.json: the reserved names, and the stored text with
// spaces turned back into "▁" (llama2.c's export turned "▁" into spaces).
absl::StatusOr<std::vector<std::string>> PiecesOf(const std::vector<Token>& tokens,
                                                  std::string_view name) {
  std::vector<std::string> pieces;
  pieces.reserve(tokens.size());
  pieces.push_back("<unk>");
  pieces.push_back("<s>");
  pieces.push_back("</s>");
  for (size_t id = kFirstByteId; id < tokens.size(); ++id) {
    if (id < kNumReserved) {
      const std::string expected = absl::StrFormat("<0x%02X>", id - kFirstByteId);
      if (tokens[id].piece != expected) {
        return absl::InvalidArgumentError(absl::StrCat(ToAbsl(name), ": token ", id, " is '",
                                                       absl::CHexEscape(tokens[id].piece),
                                                       "', expected the byte token ", expected));
      }
      pieces.push_back(expected);
    } else {
      pieces.push_back(tokenizer::ReplaceAll(tokens[id].piece, " ", kSpace));
    }
  }
  return pieces;
}

size_t CodePoints(std::string_view s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

struct Merge {
  int32_t left;
  int32_t right;
  float score;
  size_t left_chars;
  size_t right_chars;
};

// transformers' generate_merges: every split of every piece into two vocabulary pieces, within
// a piece ordered by the parts' ids, then stably by (score, left length, right length), highest
// first.
std::vector<Merge> GenerateMerges(const std::vector<std::string>& pieces,
                                  const std::vector<Token>& tokens,
                                  const absl::flat_hash_map<std::string, int32_t>& ids) {
  std::vector<Merge> merges;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& piece = pieces[id];
    std::vector<Merge> local;
    for (size_t cut = 1; cut < piece.size(); ++cut) {
      if ((static_cast<uint8_t>(piece[cut]) & 0xC0) == 0x80) continue;  // inside a character
      const auto left = ids.find(ToAbsl(std::string_view(piece).substr(0, cut)));
      const auto right = ids.find(ToAbsl(std::string_view(piece).substr(cut)));
      if (left == ids.end() || right == ids.end()) continue;
      local.push_back({left->second, right->second, tokens[id].score,
                       CodePoints(piece.substr(0, cut)), CodePoints(piece.substr(cut))});
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return std::pair(a.left, a.right) < std::pair(b.left, b.right);
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  return merges;
}

OrderedJson SpecialAddedToken(int32_t id, std::string_view content) {
  return OrderedJson{{"id", id},        {"content", content}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                     {"special", true}};
}

std::string TokenizerJson(const std::vector<std::string>& pieces,
                          const std::vector<Merge>& merges) {
  OrderedJson vocab = OrderedJson::object();
  for (size_t id = 0; id < pieces.size(); ++id) vocab[pieces[id]] = id;
  OrderedJson merge_list = OrderedJson::array();
  for (const Merge& m : merges)
    merge_list.push_back(absl::StrCat(pieces[m.left], " ", pieces[m.right]));
  const OrderedJson bos_template = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  OrderedJson root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {SpecialAddedToken(0, "<unk>"), SpecialAddedToken(1, "<s>"), SpecialAddedToken(2, "</s>")}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", kSpace}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {bos_template, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {bos_template,
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
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
        {"vocab", std::move(vocab)},
        {"merges", std::move(merge_list)}}}};
  return root.dump(2);
}

}  // namespace

absl::StatusOr<HfTokenizerFiles> ConvertLlama2cTokenizerBytes(std::string_view bytes,
                                                              int32_t vocab_size,
                                                              std::string_view name) {
  absl::StatusOr<std::vector<Token>> tokens = ReadTokens(bytes, vocab_size, name);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<std::string>> pieces = PiecesOf(*tokens, name);
  if (!pieces.ok()) return pieces.status();
  absl::flat_hash_map<std::string, int32_t> ids;
  for (size_t id = 0; id < pieces->size(); ++id) {
    const auto [it, inserted] = ids.emplace((*pieces)[id], static_cast<int32_t>(id));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(ToAbsl(name), ": tokens ", it->second, " and ",
                                                     id, " are both '", (*pieces)[id], "'"));
    }
  }
  HfTokenizerFiles files;
  files.tokenizer_json = TokenizerJson(*pieces, GenerateMerges(*pieces, *tokens, ids));
  files.tokenizer_config_json =
      OrderedJson{{"add_bos_token", true}, {"add_eos_token", false},
                  {"bos_token", "<s>"},    {"eos_token", "</s>"},
                  {"unk_token", "<unk>"},  {"clean_up_tokenization_spaces", false}}
          .dump(2);
  files.generation_config_json = OrderedJson{{"bos_token_id", 1}, {"eos_token_id", 2}}.dump(2);
  return files;
}

absl::StatusOr<HfTokenizerFiles> ConvertLlama2cTokenizer(const std::filesystem::path& tokenizer_bin,
                                                         int32_t vocab_size) {
  std::ifstream in(tokenizer_bin, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(tokenizer_bin.string(), ": cannot open"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(tokenizer_bin.string(), ": read error"));
  return ConvertLlama2cTokenizerBytes(buffer.str(), vocab_size, tokenizer_bin.string());
}

}  // namespace specd
