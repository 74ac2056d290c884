// The BPE model on tiny vocabularies whose results can be worked out by hand.
#include "common/tokenizer/bpe.h"

#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"

namespace specd::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Vocab = absl::flat_hash_map<std::string, int32_t>;
using Merges = std::vector<std::pair<std::string, std::string>>;

std::unique_ptr<BpeModel> Make(const Vocab& vocab, const Merges& merges,
                               const BpeOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<BpeModel>> m = BpeModel::Create(vocab, merges, options, "test");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Tok(const BpeModel& m, std::string_view word) {
  std::vector<int32_t> ids;
  const absl::Status s = m.Tokenize(word, &ids);
  EXPECT_TRUE(s.ok()) << s;
  return ids;
}

const Vocab kAbc = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}};

TEST(BpeTest, MergesByRankNotByPosition) {
  EXPECT_THAT(Tok(*Make(kAbc, {{"b", "c"}, {"a", "b"}}), "abc"), ElementsAre(0, 4));
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "b"}, {"b", "c"}}), "abc"), ElementsAre(3, 2));
  EXPECT_THAT(Tok(*Make(kAbc, {{"b", "c"}, {"a", "bc"}}), "abc"), ElementsAre(5));
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "b"}, {"ab", "c"}}), "abcab"), ElementsAre(5, 3));
}

TEST(BpeTest, EqualRanksMergeLeftmostFirst) {
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "a"}}), "aaa"), ElementsAre(6, 0));
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "a"}}), "aaaa"), ElementsAre(6, 6));
}

TEST(BpeTest, ARepeatedMergeKeepsItsLastRank) {
  // (a,b) listed first and again after (b,c): the later rank wins, so (b,c) merges first.
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "b"}, {"b", "c"}, {"a", "b"}}), "abc"), ElementsAre(0, 4));
}

Vocab WithByteTokens(Vocab vocab) {
  const int32_t base = 100;
  for (int b = 0; b < 256; ++b) vocab[absl::StrFormat("<0x%02X>", b)] = base + b;
  return vocab;
}

TEST(BpeTest, ByteFallbackSpellsUnknownCharactersAsUtf8Bytes) {
  BpeOptions options;
  options.byte_fallback = true;
  const auto m = Make(WithByteTokens(kAbc), {{"a", "b"}}, options);
  // "é" = C3 A9 is not in the vocabulary.
  EXPECT_THAT(Tok(*m,
                  "ab\xC3\xA9"
                  "a"),
              ElementsAre(3, 100 + 0xC3, 100 + 0xA9, 0));
}

TEST(BpeTest, UnknownCharactersBecomeUnkFusedOrNot) {
  Vocab vocab = kAbc;
  vocab["<unk>"] = 9;
  BpeOptions options;
  options.unk_id = 9;
  EXPECT_THAT(Tok(*Make(vocab, {}, options), "axyb"), ElementsAre(0, 9, 9, 1));
  options.fuse_unk = true;
  EXPECT_THAT(Tok(*Make(vocab, {}, options), "axyb"), ElementsAre(0, 9, 1));
  // Byte fallback without the byte tokens in the vocabulary falls back to unk.
  options.byte_fallback = true;
  EXPECT_THAT(Tok(*Make(vocab, {}, options), "x"), ElementsAre(9));
}

TEST(BpeTest, AnUnknownCharacterWithoutUnkIsAnError) {
  const auto m = Make(kAbc, {});
  std::vector<int32_t> ids;
  const absl::Status s = m->Tokenize("aq", &ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'q' is not in the vocabulary and the model has no unk"));
}

TEST(BpeTest, IgnoreMergesMapsAWordInTheVocabularyStraightToItsId) {
  // Merges alone give (ab, c); with ignore_merges the word "abc" is one token.
  BpeOptions options;
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "b"}}, options), "abc"), ElementsAre(3, 2));
  options.ignore_merges = true;
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "b"}}, options), "abc"), ElementsAre(5));
  EXPECT_THAT(Tok(*Make(kAbc, {{"a", "b"}}, options), "abca"), ElementsAre(3, 2, 0));
}

TEST(BpeTest, RawByteInputUsesTheByteLevelVocabulary) {
  Vocab vocab;
  for (int b = 0; b < 256; ++b) vocab[specd::testing::ByteChar(b)] = b;
  const std::string g = specd::testing::ByteChar(' ');
  vocab[g + "t"] = 256;
  BpeOptions options;
  options.raw_byte_input = true;
  options.cache_words = true;
  const auto m = Make(vocab, {{g, "t"}}, options);
  EXPECT_THAT(Tok(*m, " t"), ElementsAre(256));
  EXPECT_THAT(Tok(*m, " t"), ElementsAre(256));  // from the cache
  EXPECT_THAT(Tok(*m, "\n\xFF"), ElementsAre(0x0A, 0xFF));
}

TEST(BpeTest, MergesNamingUnknownTokensAreRejected) {
  for (const auto& [merges, expected] : std::vector<std::pair<Merges, std::string>>{
           {{{"a", "q"}}, "merges[0] ('a', 'q'): the right part 'q' is not in the vocabulary"},
           {{{"a", "b"}, {"q", "a"}}, "merges[1] ('q', 'a'): the left part 'q'"},
           {{{"c", "a"}}, "merges[0] ('c', 'a'): the merged token 'ca' is not in the vocabulary"},
       }) {
    absl::StatusOr<std::unique_ptr<BpeModel>> m =
        BpeModel::Create(kAbc, merges, {}, "tokenizer.json: model");
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("tokenizer.json: model: " + expected));
  }
}

TEST(BpeTest, ChunkingAtSpacesIsUsedOnlyWhereNoMergeCanCrossAndChangesNothing) {
  const std::string s = specd::testing::kSpm;
  Vocab vocab = {{s, 0},    {"a", 1},   {"b", 2},      {s + "a", 3},
                 {"ab", 4}, {s + s, 5}, {s + "ab", 6}, {"b" + s, 7}};
  const Merges spm = {{s, "a"}, {"a", "b"}, {s, s}, {s + "a", "b"}};
  BpeOptions chunked;
  chunked.chunk_before = s;
  const auto with = Make(vocab, spm, chunked);
  const auto without = Make(vocab, spm);
  EXPECT_TRUE(with->chunks_words());
  EXPECT_FALSE(without->chunks_words());
  // A merge whose result has "▁" after another character makes chunking inexact: refused.
  Merges crossing = spm;
  crossing.push_back({"b", s});
  EXPECT_FALSE(Make(vocab, crossing, chunked)->chunks_words());

  // (▁,a) outranks (▁,▁), so the second pair of spaces never merges: ▁ab ▁ ▁a.
  EXPECT_THAT(Tok(*with, s + "ab" + s + s + "a"), ElementsAre(6, 0, 3));
  EXPECT_THAT(Tok(*with, s + s + "b"), ElementsAre(5, 2));
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {s, "a", "b"};
  for (int i = 0; i < 300; ++i) {
    std::string word;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) word += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(Tok(*with, word), Tok(*without, word)) << word;
  }
}

}  // namespace
}  // namespace specd::tokenizer
