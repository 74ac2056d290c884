// End-to-end Encode/Decode on the hand-checkable mini tokenizers (see mini_tokenizers.h for the
// vocabularies the expected ids come from).
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"

namespace specd {
namespace {

using specd::testing::kSpm;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

std::unique_ptr<Tokenizer> Load(const nlohmann::json& tokenizer_json) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(tokenizer_json.dump(), "", "");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

std::vector<int32_t> Enc(const Tokenizer& tok, std::string_view text, EncodeOptions options = {}) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, options);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string Dec(const Tokenizer& tok, std::vector<int32_t> ids, bool skip_special = false) {
  absl::StatusOr<std::string> text = tok.Decode(ids, skip_special);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(SpmTokenizerTest, EncodesWithPrependReplaceAndByteFallback) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // The template prepends <s> (1) when nothing else says so.
  EXPECT_THAT(Enc(*tok, "the cat"), ElementsAre(1, 267, 269, 260));
  EXPECT_THAT(Enc(*tok, "the cat", {.add_bos = false}), ElementsAre(267, 269, 260));
  EXPECT_THAT(Enc(*tok, ""), ElementsAre(1));
  EXPECT_THAT(Enc(*tok, "  ", {.add_bos = false}), ElementsAre(270, 259));  // "▁▁▁"
  // "x" and "ü" (C3 BC) are not pieces: their bytes are <0xXX> tokens, id 3 + byte.
  EXPECT_THAT(Enc(*tok, "x", {.add_bos = false}), ElementsAre(259, 3 + 'x'));
  EXPECT_THAT(Enc(*tok, "\xC3\xBC", {.add_bos = false}), ElementsAre(259, 3 + 0xC3, 3 + 0xBC));
  EXPECT_THAT(Enc(*tok, "\xC3\xA9", {.add_bos = false}), ElementsAre(259, 271));  // "é" is one
}

TEST(SpmTokenizerTest, SpecialTokensInTextOnlyWhenAsked) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // Each text segment around <s> is normalized on its own, so "cat" gets its own "▁".
  EXPECT_THAT(Enc(*tok, "the<s>cat", {.add_bos = false, .parse_special = true}),
              ElementsAre(267, 1, 269, 260));
  EXPECT_THAT(Enc(*tok, "the<s>cat", {.add_bos = false}),
              ElementsAre(267, 3 + '<', 3 + 's', 3 + '>', 268, 260));
}

TEST(SpmTokenizerTest, DecodesStrippingOneLeadingSpace) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Dec(*tok, {267, 269, 260}), "the cat");
  EXPECT_EQ(Dec(*tok, {1, 267}), "<s> the");
  EXPECT_EQ(Dec(*tok, {1, 267}, /*skip_special=*/true), "the");
  EXPECT_EQ(Dec(*tok, {259, 3 + 0xC3, 3 + 0xBC}), "\xC3\xBC");
  EXPECT_EQ(Dec(*tok, {3 + 0xC3}), R);
  EXPECT_EQ(Dec(*tok, {3 + 'x', 3 + 0xC3, 267}), R + R + " the");  // each byte of a bad run
  EXPECT_EQ(Dec(*tok, {}), "");
}

TEST(SpmTokenizerTest, Properties) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 272);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->eos_ids().empty());
  EXPECT_TRUE(tok->IsSpecial(1));
  EXPECT_FALSE(tok->IsSpecial(267));
  EXPECT_EQ(*tok->IdToPiece(267), std::string(kSpm) + "the");
  EXPECT_EQ(*tok->IdToPiece(13), "<0x0A>");
}

TEST(ByteLevelTokenizerTest, EncodesLikeLlama3) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Enc(*tok, "the"), ElementsAre('t', 257));  // no BOS: no template
  EXPECT_THAT(Enc(*tok, " the"), ElementsAre(258));
  // "hello" is in the vocabulary (ignore_merges); " hello" is merged: Ġ, hel, l, o.
  EXPECT_THAT(Enc(*tok, "hello"), ElementsAre(261));
  EXPECT_THAT(Enc(*tok, " hello"), ElementsAre(' ', 262, 'l', 'o'));
  EXPECT_THAT(Enc(*tok, "\xC3\xA4"), ElementsAre(259));
  // "\s+(?!\S)" leaves the last space for " x".
  EXPECT_THAT(Enc(*tok, "  x"), ElementsAre(' ', ' ', 'x'));
  EXPECT_THAT(Enc(*tok, "a\n\nb"), ElementsAre('a', '\n', '\n', 'b'));
}

TEST(ByteLevelTokenizerTest, AddedTokens) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Enc(*tok, "<|eot_id|>"),
              ElementsAre('<', '|', 'e', 'o', 't', '_', 'i', 'd', '|', '>'));
  EXPECT_THAT(Enc(*tok, "<|eot_id|>", {.add_bos = std::nullopt, .parse_special = true}),
              ElementsAre(301));
  // Non-special added tokens are always recognised, as in Hugging Face.
  EXPECT_THAT(Enc(*tok, "a[x]b"), ElementsAre('a', 302, 'b'));
}

TEST(ByteLevelTokenizerTest, Decodes) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Dec(*tok, {258, 259}), " the\xC3\xA4");
  EXPECT_EQ(Dec(*tok, {0xC3}), R);
  EXPECT_EQ(Dec(*tok, {0xC3, 0xA4}), "\xC3\xA4");
  EXPECT_EQ(Dec(*tok, {300, 't'}), "<|begin_of_text|>t");
  EXPECT_EQ(Dec(*tok, {300, 't'}, /*skip_special=*/true), "t");
  EXPECT_EQ(Dec(*tok, {302}, /*skip_special=*/true), "[x]");  // not special: kept
}

TEST(TokenizerTest, RejectsInvalidUtf8AndOutOfRangeIds) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  const absl::StatusOr<std::vector<int32_t>> ids = tok->Encode("ok\xFF");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("not valid UTF-8 at byte 2"));
  for (const int32_t bad : {-1, 303, 280}) {  // 280 lies in the gap between 262 and 300
    const std::vector<int32_t> input = {'a', bad};
    const absl::StatusOr<std::string> text = tok->Decode(input);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(text.status().message()),
                HasSubstr("token id " + std::to_string(bad) + " at position 1 is out of range"));
    EXPECT_EQ(tok->IdToPiece(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TokenizerTest, FingerprintFollowsTheVocabularyNotTheSerialisation) {
  nlohmann::json a = testing::MiniSpmTokenizerJson();
  nlohmann::json b = a;
  // The newer serialisation of the same merges: pairs instead of "a b" strings.
  for (auto& m : b["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    m = nlohmann::json::array({s.substr(0, space), s.substr(space + 1)});
  }
  nlohmann::json c = a;
  c["model"]["merges"].erase(c["model"]["merges"].end() - 1);
  const auto ta = Load(a);
  const auto tb = Load(b);
  const auto tc = Load(c);
  ASSERT_TRUE(ta && tb && tc);
  EXPECT_EQ(ta->Fingerprint().size(), 64u);
  EXPECT_EQ(ta->Fingerprint(), tb->Fingerprint());
  EXPECT_NE(ta->Fingerprint(), tc->Fingerprint());
}

}  // namespace
}  // namespace specd
