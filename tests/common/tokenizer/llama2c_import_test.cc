// ConvertLlama2cTokenizer on small hand-made tokenizer.bin files.
#include "common/tokenizer/llama2c_import.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void AppendInt32(int32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i)
    out->push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xFF));
}

void AppendFloat(float f, std::string* out) {
  int32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  AppendInt32(bits, out);
}

struct BinToken {
  std::string piece;
  float score;
};

// The 259 reserved tokens as llama2.c's export writes them, then `extra`.
std::vector<BinToken> Tokens(const std::vector<BinToken>& extra) {
  std::vector<BinToken> tokens = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  for (int b = 0; b < 256; ++b) tokens.push_back({absl::StrFormat("<0x%02X>", b), 0});
  tokens.insert(tokens.end(), extra.begin(), extra.end());
  return tokens;
}

std::string Bin(const std::vector<BinToken>& tokens, int32_t max_token_length = 16) {
  std::string out;
  AppendInt32(max_token_length, &out);
  for (const BinToken& t : tokens) {
    AppendFloat(t.score, &out);
    AppendInt32(static_cast<int32_t>(t.piece.size()), &out);
    out += t.piece;
  }
  return out;
}

// llama2.c's export writes SentencePiece's "▁" as a space.
const std::vector<BinToken> kPieces = {
    {" t", -1}, {"he", -2}, {" the", -3}, {"th", -4}, {" ", -10},  {"t", -11},  {"h", -12},
    {"e", -13}, {"x", -14}, {"y", -15},   {"z", -16}, {"xy", -20}, {"yz", -21}, {"xyz", -6}};

TEST(Llama2cImportTest, WritesASentencePieceStyleTokenizer) {
  const std::vector<BinToken> tokens = Tokens(kPieces);
  absl::StatusOr<HfTokenizerFiles> files =
      ConvertLlama2cTokenizerBytes(Bin(tokens), static_cast<int32_t>(tokens.size()), "tok.bin");
  ASSERT_TRUE(files.ok()) << files.status();
  const nlohmann::json j = nlohmann::json::parse(files->tokenizer_json);
  const std::string s = "\xE2\x96\x81";
  EXPECT_EQ(j["model"]["vocab"]["<s>"], 1);
  EXPECT_EQ(j["model"]["vocab"]["</s>"], 2);
  EXPECT_EQ(j["model"]["vocab"]["<0x0A>"], 13);
  EXPECT_EQ(j["model"]["vocab"][s + "the"], 261);
  EXPECT_TRUE(j["model"]["byte_fallback"].get<bool>());
  // Highest score first; "xyz" (-6) has two splits of equal score: the longer left part first.
  EXPECT_EQ(j["model"]["merges"], nlohmann::json::array({s + " t", "h e", s + "t he", "t h", "xy z",
                                                         "x yz", "x y", "y z"}));
  EXPECT_EQ(nlohmann::json::parse(files->tokenizer_config_json)["add_bos_token"], true);
  EXPECT_EQ(nlohmann::json::parse(files->generation_config_json)["eos_token_id"], 2);

  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(
      files->tokenizer_json, files->tokenizer_config_json, files->generation_config_json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("the"), ElementsAre(1, 261));
  EXPECT_THAT(*(*tok)->Encode("xyz q"), ElementsAre(1, 263, 272, 263, 3 + 'q'));
  EXPECT_EQ(*(*tok)->Decode(std::vector<int32_t>{261, 259, 13}), "the t\n");
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{2});
}

TEST(Llama2cImportTest, RejectsInconsistentFiles) {
  const std::vector<BinToken> tokens = Tokens(kPieces);
  const int32_t n = static_cast<int32_t>(tokens.size());
  const std::string good = Bin(tokens);
  std::vector<BinToken> bad_byte = tokens;
  bad_byte[3 + 0x41].piece = "A";
  std::vector<BinToken> dup = tokens;
  dup.back().piece = " t";
  std::vector<BinToken> nan = tokens;
  nan.back().score = std::nanf("");
  std::vector<BinToken> invalid_utf8 = tokens;
  invalid_utf8.back().piece = "\xFF";
  std::string negative = Bin(Tokens({}));
  AppendFloat(0, &negative);
  AppendInt32(-5, &negative);

  const std::vector<std::tuple<std::string, int32_t, std::string>> cases = {
      {good.substr(0, 2), n,
       "tok.bin: truncated: the file is 2 bytes, too short for the "
       "max_token_length header"},
      {good.substr(0, good.size() - 2), n, "tok.bin: truncated at byte"},
      {good, n + 1,
       "token " + std::to_string(n) + " of " + std::to_string(n + 1) +
           " is missing (is vocab_size too large?)"},
      {good, n - 1,
       "bytes follow the " + std::to_string(n - 1) + " tokens (is vocab_size too small?)"},
      {good, 100, "vocab_size 100 is too small"},
      {Bin(tokens, 2), n, "has length 5, outside 0..max_token_length (2)"},
      {Bin(tokens, -1), n, "max_token_length -1 is not a plausible length"},
      {negative, 260, "token 259 at byte"},
      {Bin(bad_byte), n, "token 68 is 'A', expected the byte token <0x41>"},
      {Bin(dup), n, "are both '\xE2\x96\x81t'"},
      {Bin(nan), n, "has a non-finite score"},
      {Bin(invalid_utf8), n, "is not valid UTF-8"},
  };
  for (const auto& [bytes, vocab_size, message] : cases) {
    SCOPED_TRACE(message);
    const absl::Status s = ConvertLlama2cTokenizerBytes(bytes, vocab_size, "tok.bin").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
}

TEST(Llama2cImportTest, NamesAMissingFile) {
  testing::ScopedTempDir dir;
  const absl::Status s = ConvertLlama2cTokenizer(dir.path() / "nope.bin", 512).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nope.bin: cannot open"));
}

}  // namespace
}  // namespace specd
