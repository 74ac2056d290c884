// UTF-8 helpers, GPT-2's byte table, SHA-256 and the regex whitespace translation, against
// published references (Unicode 15 §3.9 Table 3-8, FIPS 180-4 test vectors, GPT-2's
// bytes_to_unicode).
#include "common/tokenizer/utf8.h"

#include <string>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd::tokenizer {
namespace {

using ::testing::HasSubstr;

TEST(Utf8Test, FindsTheFirstInvalidByte) {
  EXPECT_EQ(FindInvalidUtf8("plain ascii"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("caf\xC3\xA9 \xF0\x9F\x98\x80"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("ab\xFF"), 2u);
  EXPECT_EQ(FindInvalidUtf8("a\xC3"), 1u);             // truncated sequence
  EXPECT_EQ(FindInvalidUtf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(FindInvalidUtf8("xy\xED\xA0\x80"), 2u);    // surrogate U+D800
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
}

TEST(Utf8Test, ValidateNamesTheOffset) {
  const absl::Status s = ValidateUtf8("abc\x80", "text to encode");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("text to encode is not valid UTF-8 at byte 3"));
}

TEST(Utf8Test, LossyConversionReplacesMaximalSubparts) {
  // Unicode 15.0 §3.9, Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string input = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = std::string(kReplacementChar);
  EXPECT_EQ(Utf8Lossy(input), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(Utf8Lossy("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
  EXPECT_EQ(Utf8Lossy("\xE2\x82"), r);  // a truncated sequence is one maximal subpart
}

TEST(Utf8Test, DecodesAndEncodesCodePoints) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
  size_t pos = 0;
  EXPECT_EQ(DecodeUtf8(s, &pos), U'a');
  EXPECT_EQ(DecodeUtf8(s, &pos), U'\u00E9');
  EXPECT_EQ(DecodeUtf8(s, &pos), U'\u20AC');
  EXPECT_EQ(DecodeUtf8(s, &pos), U'\U0001F600');
  EXPECT_EQ(pos, s.size());
  size_t start = 0;
  EXPECT_EQ(DecodeUtf8Backward(s, s.size(), &start), U'\U0001F600');
  EXPECT_EQ(start, 6u);
  std::string out;
  for (const char32_t cp : {U'a', U'\u00E9', U'\u20AC', U'\U0001F600'}) AppendUtf8(cp, &out);
  EXPECT_EQ(out, s);
}

TEST(Utf8Test, WhiteSpaceIsTheUnicodeProperty) {
  for (const char32_t cp :
       {U'\t', U'\n', U'\r', U' ', U'\u0085', U'\u00A0', U'\u2003', U'\u3000'}) {
    EXPECT_TRUE(IsUnicodeWhiteSpace(cp)) << static_cast<uint32_t>(cp);
  }
  // U+180E stopped being whitespace in Unicode 6.3; U+200B was never White_Space.
  for (const char32_t cp : {U'a', U'\u180E', U'\u200B', U'\uFEFF'}) {
    EXPECT_FALSE(IsUnicodeWhiteSpace(cp)) << static_cast<uint32_t>(cp);
  }
}

TEST(ByteLevelTest, MatchesGpt2BytesToUnicode) {
  // bytes_to_unicode(): printable bytes map to themselves, the 68 others to U+0100 upwards.
  EXPECT_EQ(ByteLevelChar('A'), "A");
  EXPECT_EQ(ByteLevelChar(0x00), "\xC4\x80");  // U+0100
  EXPECT_EQ(ByteLevelChar(0x0A), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(ByteLevelChar(0x20), "\xC4\xA0");  // U+0120 'Ġ'
  EXPECT_EQ(ByteLevelChar(0xAD), "\xC5\x83");  // U+0143 'Ń', the last remapped byte
  EXPECT_EQ(ByteLevelChar(0xE9), "\xC3\xA9");  // printable Latin-1 keeps its code point
  EXPECT_EQ(ByteLevelByte(0x120), 0x20);
  EXPECT_EQ(ByteLevelByte(0x144), std::nullopt);  // past the 68 remapped code points
  EXPECT_EQ(ByteLevelByte(0x20), std::nullopt);   // a space is never a byte-level character
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(ByteLevelDecode(ByteLevelEncode(all)), all);
  EXPECT_EQ(ByteLevelDecode("a b"), std::nullopt);
}

TEST(Sha256Test, MatchesFips180Vectors) {
  Sha256 empty;
  EXPECT_EQ(empty.HexDigest(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.Update("abc");
  EXPECT_EQ(abc.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // The two-block message, fed in uneven pieces to exercise buffering.
  Sha256 two_blocks;
  const std::string msg = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  two_blocks.Update(msg.substr(0, 5));
  two_blocks.Update(msg.substr(5, 50));
  two_blocks.Update(msg.substr(55));
  EXPECT_EQ(two_blocks.HexDigest(),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(RegexTest, TranslatesWhitespaceClassesOnly) {
  EXPECT_EQ(TranslateWhitespaceClasses("\\s+(?!\\S)"), "\\p{White_Space}+(?!\\P{White_Space})");
  EXPECT_EQ(TranslateWhitespaceClasses("[^\\s\\p{L}]"), "[^\\p{White_Space}\\p{L}]");
  EXPECT_EQ(TranslateWhitespaceClasses("\\\\s"), "\\\\s");  // an escaped backslash, then 's'
}

TEST(RegexTest, FindsMatchesAndRejectsBadPatterns) {
  absl::StatusOr<std::unique_ptr<Regex>> re = Regex::Compile("\\s+", "test");
  ASSERT_TRUE(re.ok()) << re.status();
  std::vector<std::pair<size_t, size_t>> matches;
  // U+180E is not whitespace for Oniguruma; PCRE2's own \s would match it.
  ASSERT_TRUE((*re)->FindAll("a b\xE1\xA0\x8E\t\tc", &matches).ok());
  EXPECT_EQ(matches, (std::vector<std::pair<size_t, size_t>>{{1, 2}, {6, 8}}));
  absl::StatusOr<std::unique_ptr<Regex>> bad = Regex::Compile("(unclosed", "tokenizer.json: x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("tokenizer.json: x: cannot compile regex"));
}

TEST(RegexTest, EmptyMatchesAdvanceLikeOniguruma) {
  absl::StatusOr<std::unique_ptr<Regex>> re = Regex::Compile("x*", "test");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> matches;
  ASSERT_TRUE((*re)->FindAll("axxb", &matches).ok());
  // Empty at 0, "xx" at 1..3, then the empty match at 3 touches it and is skipped, empty at 4.
  EXPECT_EQ(matches, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}, {4, 4}}));
}

}  // namespace
}  // namespace specd::tokenizer
