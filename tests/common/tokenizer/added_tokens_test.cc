// Added-token matching, with the cases of tokenizers' added_vocabulary.rs tests (lowercasing
// removed: their inputs are written here already in lowercase where the normalizer mattered).
#include "common/tokenizer/added_tokens.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

AddedToken Token(int32_t id, std::string content, bool special) {
  AddedToken t;
  t.id = id;
  t.content = std::move(content);
  t.special = special;
  return t;
}

std::vector<std::pair<std::string, int32_t>> SplitText(const std::vector<AddedToken>& tokens,
                                                       std::string_view text, bool parse_special) {
  std::vector<std::pair<std::string, const AddedToken*>> entries;
  for (const AddedToken& t : tokens) entries.emplace_back(t.content, &t);
  const AddedTokenMatcher matcher(std::move(entries));
  std::vector<Segment> segments;
  matcher.Split(text, parse_special, &segments);
  std::vector<std::pair<std::string, int32_t>> out;
  for (const Segment& s : segments) {
    out.emplace_back(std::string(text.substr(s.begin, s.end - s.begin)), s.token_id);
  }
  return out;
}

TEST(AddedTokensTest, ExtractsNormalAndSpecialTokens) {
  const std::vector<AddedToken> tokens = {Token(0, "my", false), Token(1, "name", false),
                                          Token(2, "[CLS]", true), Token(3, "[SEP]", true)};
  EXPECT_THAT(SplitText(tokens, "[CLS] My name is Anthony [SEP]", /*parse_special=*/true),
              ElementsAre(Pair("[CLS]", 2), Pair(" My ", -1), Pair("name", 1),
                          Pair(" is Anthony ", -1), Pair("[SEP]", 3)));
  // Without parse_special only the non-special added tokens are recognised.
  EXPECT_THAT(SplitText(tokens, "[CLS] My name is Anthony [SEP]", /*parse_special=*/false),
              ElementsAre(Pair("[CLS] My ", -1), Pair("name", 1), Pair(" is Anthony [SEP]", -1)));
}

TEST(AddedTokensTest, LstripRstripAndSingleWord) {
  std::vector<AddedToken> tokens = {Token(0, "my", false), Token(1, "name", false),
                                    Token(2, "ony", false), Token(3, "[CLS]", true),
                                    Token(4, "[SEP]", true)};
  tokens[0].lstrip = true;
  tokens[0].rstrip = true;
  tokens[2].single_word = true;
  EXPECT_THAT(SplitText(tokens, "[CLS] my name is anthony [SEP]", true),
              ElementsAre(Pair("[CLS]", 3), Pair(" my ", 0), Pair("name", 1),
                          Pair(" is anthony ", -1), Pair("[SEP]", 4)));
}

TEST(AddedTokensTest, SingleWordNeedsNonWordCharactersAround) {
  std::vector<AddedToken> tokens = {Token(0, "<mask>", false)};
  tokens[0].single_word = true;
  EXPECT_THAT(SplitText(tokens, "<mask> my name <mask> a<mask> <mask>ony <mask>", false),
              ElementsAre(Pair("<mask>", 0), Pair(" my name ", -1), Pair("<mask>", 0),
                          Pair(" a<mask> <mask>ony ", -1), Pair("<mask>", 0)));
  // Punctuation is not a word character; a combining mark (U+0330) is.
  EXPECT_THAT(SplitText(tokens, "<mask>, <mask>- \xE2\x97\x8C\xCC\xB0<mask>", false),
              ElementsAre(Pair("<mask>", 0), Pair(", ", -1), Pair("<mask>", 0),
                          Pair("- \xE2\x97\x8C\xCC\xB0<mask>", -1)));
}

TEST(AddedTokensTest, StripTakesUnicodeWhitespaceWithoutOverlapping) {
  std::vector<AddedToken> tokens = {Token(0, "<mask>", false)};
  tokens[0].lstrip = true;
  tokens[0].rstrip = true;
  tokens[0].single_word = true;
  EXPECT_THAT(SplitText(tokens, "Hi <mask> there\t<mask>\t<mask>\xE2\x80\x80", false),
              ElementsAre(Pair("Hi", -1), Pair(" <mask> ", 0), Pair("there", -1),
                          Pair("\t<mask>\t", 0), Pair("<mask>\xE2\x80\x80", 0)));
}

TEST(AddedTokensTest, LeftmostLongestMatchWins) {
  const std::vector<AddedToken> tokens = {Token(0, "<a>", true), Token(1, "<a><b>", true),
                                          Token(2, "b>", true)};
  EXPECT_THAT(SplitText(tokens, "x<a><b>y<a>", true),
              ElementsAre(Pair("x", -1), Pair("<a><b>", 1), Pair("y", -1), Pair("<a>", 0)));
  // A special token that is not parsed still consumes its text: "b>" inside it is not found.
  EXPECT_THAT(SplitText(tokens, "<a><b>", false), ElementsAre(Pair("<a><b>", -1)));
  EXPECT_TRUE(SplitText(tokens, "", true).empty());
}

}  // namespace
}  // namespace specd::tokenizer
