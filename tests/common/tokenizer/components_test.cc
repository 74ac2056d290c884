// Normalizers, pre-tokenizers and decoders one rule at a time. Expected values are worked out by
// hand from Hugging Face's documented behaviour; several are the cases of `tokenizers`' own unit
// tests (metaspace.rs, byte_fallback.rs, strip.rs).
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/regex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"

namespace specd::tokenizer {
namespace {

using specd::testing::kSpm;
using ::testing::ElementsAre;

const std::string S = kSpm;            // "▁"
const std::string G = "\xC4\xA0";      // "Ġ", byte-level space
const std::string R = "\xEF\xBF\xBD";  // U+FFFD

std::vector<std::string> PreTokenize(const PreTokenizer& pt, const std::vector<Piece>& input,
                                     bool raw_bytes_out = false) {
  std::vector<Piece> pieces = input;
  PieceArena arena;
  const absl::Status s = pt.Apply(&pieces, &arena, raw_bytes_out);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<std::string> out;
  for (const Piece& p : pieces) out.emplace_back(p.text);
  return out;
}

std::shared_ptr<const Regex> Compile(std::string_view pattern) {
  absl::StatusOr<std::unique_ptr<Regex>> re = Regex::Compile(pattern, "test");
  EXPECT_TRUE(re.ok()) << re.status();
  return std::move(*re);
}

TEST(NormalizerTest, PrependsToNonEmptyTextAndReplacesEveryOccurrence) {
  const Normalizer n(
      {{NormalizerStep::Kind::kPrepend, S, "", ""}, {NormalizerStep::Kind::kReplace, "", " ", S}});
  EXPECT_EQ(n.Apply("Hello  world"), S + "Hello" + S + S + "world");
  EXPECT_EQ(n.Apply(" x"), S + S + "x");
  EXPECT_EQ(n.Apply(""), "");                                   // Prepend leaves empty text alone
  EXPECT_EQ(n.Apply("x y", /*prepend=*/false), "x" + S + "y");  // a continuation's start
  const Normalizer replace({{NormalizerStep::Kind::kReplace, "", "aa", "b"}});
  EXPECT_EQ(replace.Apply("aaa"), "ba");  // non-overlapping, left to right
}

TEST(PreTokenizerTest, SplitIsolatedWithTheLlama3Pattern) {
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  split.regex = Compile(specd::testing::kLlama3Pattern);
  const PreTokenizer pt({split});
  EXPECT_THAT(PreTokenize(pt, {{"Hello world's 12345 foo\n\n  bar", true}}),
              ElementsAre("Hello", " world", "'s", " ", "123", "45", " foo", "\n\n", " ", " bar"));
  // Contractions are case-insensitive; other punctuation stays with following newlines.
  EXPECT_THAT(PreTokenize(pt, {{"I'LL go!\n", true}}), ElementsAre("I", "'LL", " go", "!\n"));
}

TEST(PreTokenizerTest, ByteLevelAddsPrefixSpaceSplitsAndMapsBytes) {
  PreTokenizerStep bl;
  bl.kind = PreTokenizerStep::Kind::kByteLevel;
  bl.add_prefix_space = true;
  bl.regex = Compile(kGpt2Pattern);
  const PreTokenizer pt({bl});
  EXPECT_THAT(PreTokenize(pt, {{"Hello world", true}}), ElementsAre(G + "Hello", G + "world"));
  EXPECT_THAT(PreTokenize(pt, {{"Hello world", true}}, /*raw_bytes_out=*/true),
              ElementsAre(" Hello", " world"));
  bl.add_prefix_space = false;
  bl.regex = nullptr;
  const PreTokenizer no_regex({bl});
  // "é" is C3 A9, whose byte-level characters are "Ã" and "©".
  EXPECT_THAT(PreTokenize(no_regex, {{"a \xC3\xA9", true}}),
              ElementsAre("a" + G + "\xC3\x83\xC2\xA9"));
}

TEST(PreTokenizerTest, MetaspaceReplacesPrependsAndSplits) {
  PreTokenizerStep ms;
  ms.kind = PreTokenizerStep::Kind::kMetaspace;
  ms.replacement = S;
  ms.prepend_scheme = PrependScheme::kAlways;
  ms.split = true;
  // tokenizers' metaspace.rs "multiple_spaces" case.
  EXPECT_THAT(PreTokenize(PreTokenizer({ms}), {{"Hey   friend!", true}}),
              ElementsAre(S + "Hey", S, S, S + "friend!"));
  ms.split = false;
  EXPECT_THAT(PreTokenize(PreTokenizer({ms}), {{"a b", false}}), ElementsAre(S + "a" + S + "b"));
  // A piece that already starts with the replacement gets no second one.
  EXPECT_THAT(PreTokenize(PreTokenizer({ms}), {{" a", true}}), ElementsAre(S + "a"));
  // A continuation's first piece gets none either, even under "always".
  EXPECT_THAT(PreTokenize(PreTokenizer({ms}), {{"a", false, true}, {"b", false, false}}),
              ElementsAre("a", S + "b"));
  ms.prepend_scheme = PrependScheme::kFirst;
  EXPECT_THAT(PreTokenize(PreTokenizer({ms}), {{"a", true}, {"b", false}}),
              ElementsAre(S + "a", "b"));
  ms.prepend_scheme = PrependScheme::kNever;
  EXPECT_THAT(PreTokenize(PreTokenizer({ms}), {{"a b", true}}), ElementsAre("a" + S + "b"));
}

std::string DecodeWith(std::vector<DecoderStep> steps, std::vector<std::string> tokens) {
  return Decoder(std::move(steps)).Decode(std::move(tokens));
}

DecoderStep Step(DecoderStep::Kind kind) {
  DecoderStep s{};
  s.kind = kind;
  return s;
}

TEST(DecoderTest, ByteFallbackJoinsValidRunsAndReplacesEachByteOfInvalidOnes) {
  const std::vector<DecoderStep> bf = {Step(DecoderStep::Kind::kByteFallback)};
  // tokenizers' byte_fallback.rs cases.
  EXPECT_EQ(DecodeWith(bf, {"<0x61>"}), "a");
  EXPECT_EQ(DecodeWith(bf, {"<0xE5>"}), R);
  EXPECT_EQ(DecodeWith(bf, {"<0xE5>", "<0x8f>"}), R + R);
  EXPECT_EQ(DecodeWith(bf, {"<0xE5>", "<0x8f>", "<0xab>"}), "\xE5\x8F\xAB");  // 叫
  EXPECT_EQ(DecodeWith(bf, {"<0xE5>", "<0x8f>", "<0xab>", "a"}),
            "\xE5\x8F\xAB"
            "a");
  EXPECT_EQ(DecodeWith(bf, {"<0xE5>", "<0x8f>", "a"}), R + R + "a");
  // Not a lossy conversion: a valid byte inside an invalid run becomes U+FFFD too.
  EXPECT_EQ(DecodeWith(bf, {"<0x61>", "<0xE5>", "b"}), R + R + "b");
}

TEST(DecoderTest, ParsesByteTokensTheWayRustDoes) {
  EXPECT_EQ(ParseByteToken("<0x0A>"), 0x0A);
  EXPECT_EQ(ParseByteToken("<0x0a>"), 0x0A);
  EXPECT_EQ(ParseByteToken("<0x+A>"), 0x0A);  // u8::from_str_radix accepts a '+' sign
  EXPECT_EQ(ParseByteToken("<0xGG>"), std::nullopt);
  EXPECT_EQ(ParseByteToken("<0x0A"), std::nullopt);
  EXPECT_EQ(ParseByteToken("<0x0AB>"), std::nullopt);
}

TEST(DecoderTest, ReplaceFuseAndStripAsLlama2Declares) {
  DecoderStep replace = Step(DecoderStep::Kind::kReplace);
  replace.pattern = S;
  replace.content = " ";
  DecoderStep strip = Step(DecoderStep::Kind::kStrip);
  strip.content = " ";
  strip.strip_start = 1;
  const std::vector<DecoderStep> llama2 = {replace, Step(DecoderStep::Kind::kByteFallback),
                                           Step(DecoderStep::Kind::kFuse), strip};
  EXPECT_EQ(DecodeWith(llama2, {S + "Hello", S + "world", "<0x21>"}), "Hello world!");
  EXPECT_EQ(DecodeWith(llama2, {S + S + "x"}), " x");  // only one leading space is stripped
  EXPECT_EQ(DecodeWith(llama2, {"<s>", S + "Hi"}), "<s> Hi");
  // Before Fuse, Strip works on every token (tokenizers' strip.rs case).
  EXPECT_EQ(DecodeWith({strip}, {"Hey", " friend!", "   "}), "Heyfriend!  ");
  DecoderStep both = strip;
  both.strip_stop = 2;
  EXPECT_EQ(DecodeWith({both}, {"  a   "}), " a ");
  EXPECT_EQ(DecodeWith({both}, {" "}), "");
}

TEST(DecoderTest, ByteLevelMapsCharactersBackToBytesLossily) {
  const std::vector<DecoderStep> bl = {Step(DecoderStep::Kind::kByteLevel)};
  EXPECT_EQ(DecodeWith(bl, {"Hello", G + "world"}), "Hello world");
  // "ä" = C3 A4 split over two tokens, then one alone: a truncated sequence is one U+FFFD.
  EXPECT_EQ(DecodeWith(bl, {"\xC3\x83", "\xC2\xA4"}), "\xC3\xA4");
  EXPECT_EQ(DecodeWith(bl, {"x", "\xC3\x83"}), "x" + R);
  // A token with a character outside the table keeps its own UTF-8 bytes.
  EXPECT_EQ(DecodeWith(bl, {G + "a", S}), " a" + S);
}

TEST(DecoderTest, MetaspaceDropsTheFirstTokensReplacements) {
  DecoderStep ms = Step(DecoderStep::Kind::kMetaspace);
  ms.replacement = S;
  ms.metaspace_prepend = true;
  EXPECT_EQ(DecodeWith({ms}, {S + "Hey", S + "friend!"}), "Hey friend!");  // metaspace.rs
  EXPECT_EQ(DecodeWith({ms}, {S + S + "a" + S, S + "b"}), "a b");          // every one in token 0
  ms.metaspace_prepend = false;
  EXPECT_EQ(DecodeWith({ms}, {S + "Hey", S + "friend!"}), " Hey friend!");
}

TEST(DecoderTest, NoDecoderJoinsWithSpaces) {
  EXPECT_EQ(Decoder::None().Decode({"a", "b", "c"}), "a b c");
  EXPECT_EQ(DecodeWith({Step(DecoderStep::Kind::kFuse)}, {"a", "b"}), "ab");
}

}  // namespace
}  // namespace specd::tokenizer
