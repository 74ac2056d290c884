// IncrementalDetokenizer: the concatenation of every Push and the Flush equals Decode of all ids,
// each piece is complete UTF-8, and each push decodes only a short window.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/llama2c_import.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

std::unique_ptr<Tokenizer> Load(const nlohmann::json& tokenizer_json) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(tokenizer_json.dump(), "", "");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Forwards to a real tokenizer and records the longest id span any Decode call saw.
class WindowRecorder final : public Tokenizer {
 public:
  explicit WindowRecorder(const Tokenizer& inner) : inner_(inner) {}
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options) const override {
    return inner_.Encode(text, options);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special_tokens) const override {
    max_window_ = std::max(max_window_, ids.size());
    return inner_.Decode(ids, skip_special_tokens);
  }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  std::optional<int32_t> bos_id() const override { return inner_.bos_id(); }
  const std::vector<int32_t>& eos_ids() const override { return inner_.eos_ids(); }
  bool IsSpecial(int32_t id) const override { return inner_.IsSpecial(id); }
  absl::StatusOr<std::string> IdToPiece(int32_t id) const override { return inner_.IdToPiece(id); }
  std::string Fingerprint() const override { return inner_.Fingerprint(); }
  size_t max_window() const { return max_window_; }

 private:
  const Tokenizer& inner_;
  mutable size_t max_window_ = 0;
};

// Pushes `ids` in the given chunk sizes and returns every piece, the Flush last.
std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                const std::vector<size_t>& chunks, bool skip_special = false) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::vector<std::string> pieces;
  size_t pos = 0;
  for (const size_t n : chunks) {
    absl::StatusOr<std::string> piece = detok.Push(std::span<const int32_t>(ids).subspan(pos, n));
    EXPECT_TRUE(piece.ok()) << piece.status();
    pieces.push_back(piece.ok() ? *piece : "<error>");
    pos += n;
  }
  absl::StatusOr<std::string> last = detok.Flush();
  EXPECT_TRUE(last.ok()) << last.status();
  pieces.push_back(last.ok() ? *last : "<error>");
  return pieces;
}

std::vector<size_t> Ones(size_t n) { return std::vector<size_t>(n, 1); }

TEST(IncrementalDetokenizerTest, SpmLeadingSpaceAndByteRuns) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // "▁the" "▁ca" "t": the first token's space is stripped, the others keep theirs.
  EXPECT_THAT(Stream(*tok, {267, 269, 260}, Ones(3)),
              ::testing::ElementsAre("the", " ca", "t", ""));
  // "ü" as two byte tokens split across pushes: nothing until the run ends.
  EXPECT_THAT(Stream(*tok, {259, 3 + 0xC3, 3 + 0xBC, 267}, Ones(4)),
              ::testing::ElementsAre("", "", "", "\xC3\xBC the", ""));
  // A run cut short by the end of the stream is flushed the way Decode writes it.
  EXPECT_THAT(Stream(*tok, {267, 3 + 'x', 3 + 0xC3}, Ones(3)),
              ::testing::ElementsAre("the", "", "", R + R));
}

TEST(IncrementalDetokenizerTest, SkippedPromptIsNeverRepeated) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // A prompt ending in a byte token ("\n" under byte fallback), as chat prompts often do: the
  // reply continues after it and keeps its leading space.
  IncrementalDetokenizer detok(*tok);
  const std::vector<int32_t> prompt = {267, 3 + '\n'};
  ASSERT_TRUE(detok.Skip(prompt).ok());
  const std::vector<int32_t> reply = {269, 260};
  absl::StatusOr<std::string> first = detok.Push(std::span<const int32_t>(reply).subspan(0, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, " ca");
  absl::StatusOr<std::string> second = detok.Push(std::span<const int32_t>(reply).subspan(1));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, "t");
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), reply.begin(), reply.end());
  EXPECT_EQ(*tok->Decode(all), "the\n cat");

  // The reply's first bytes do not join the prompt's run: decoded together, "/" and an invalid
  // byte would both become U+FFFD, and the text would stall behind a changed prefix.
  IncrementalDetokenizer next(*tok);
  ASSERT_TRUE(next.Skip(std::vector<int32_t>{267, 3 + '/'}).ok());
  std::string text;
  for (const int32_t id : {3 + 0xC3, 267}) {
    absl::StatusOr<std::string> piece = next.Push(std::span<const int32_t>(&id, 1));
    ASSERT_TRUE(piece.ok()) << piece.status();
    text += *piece;
  }
  text += *next.Flush();
  EXPECT_EQ(text, R + " the");
}

TEST(IncrementalDetokenizerTest, ByteLevelCharacterSplitAcrossTokens) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // "中" = E4 B8 AD; the mini vocabulary's id for byte b is b.
  EXPECT_THAT(Stream(*tok, {' ', 0xE4, 0xB8, 0xAD, 'x'}, Ones(5)),
              ::testing::ElementsAre(" ", "", "", "\xE4\xB8\xAD", "x", ""));
  // Text ending in an incomplete character is held back whole.
  EXPECT_THAT(Stream(*tok, {'a', 0xE4, 0xB8}, {3}), ::testing::ElementsAre("", "a" + R));
}

TEST(IncrementalDetokenizerTest, SkippedSpecialTokensDoNotEatTheNextSpace) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = {1, 267, 2, 269, 2, 2, 260};
  const std::vector<std::string> pieces = Stream(*tok, ids, Ones(ids.size()), true);
  std::string all;
  for (const std::string& p : pieces) all += p;
  EXPECT_EQ(all, "the cat");
  EXPECT_EQ(all, *tok->Decode(ids, true));
  // Skipped, <s> vanishes before decoding, so the byte tokens around it are one run: "ü", and
  // "A" then a lone C3, which is invalid as a whole, so both bytes become U+FFFD.
  const std::vector<int32_t> split_run = {259, 3 + 0xC3, 1, 3 + 0xBC, 267};
  EXPECT_THAT(Stream(*tok, split_run, Ones(5), true),
              ::testing::ElementsAre("", "", "", "", "\xC3\xBC the", ""));
  const std::vector<int32_t> bad_run = {267, 3 + 'A', 1, 3 + 0xC3};
  EXPECT_THAT(Stream(*tok, bad_run, Ones(4), true),
              ::testing::ElementsAre("the", "", "", "", R + R));
}

TEST(IncrementalDetokenizerTest, BadIdsAreRejectedWithoutDisturbingTheStream) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(*detok.Push(std::vector<int32_t>{267}), "the");
  const absl::StatusOr<std::string> bad = detok.Push(std::vector<int32_t>{269, 5000});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("5000"));
  EXPECT_EQ(*detok.Push(std::vector<int32_t>{269}), " ca");
  EXPECT_EQ(*detok.Flush(), "");
}

// Random id sequences rich in byte tokens and multi-byte characters, pushed in random splits.
void CheckRandomStreams(const Tokenizer& tok, const std::vector<int32_t>& byte_ids,
                        const std::vector<int32_t>& lead_ids, const std::vector<int32_t>& cont_ids,
                        const std::vector<int32_t>& special_ids, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto pick = [&](const std::vector<int32_t>& v) { return v[rng() % v.size()]; };
  for (int s = 0; s < 300; ++s) {
    std::vector<int32_t> ids;
    const size_t n = 1 + rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t r = rng() % 100;
      if (r < 40) {
        int32_t id = static_cast<int32_t>(rng() % tok.vocab_size());
        while (!tok.IdToPiece(id).ok()) id = static_cast<int32_t>(rng() % tok.vocab_size());
        ids.push_back(id);
      } else if (r < 50) {
        ids.push_back(pick(special_ids));
      } else if (r < 65) {
        // A complete 2-4 byte character, or a deliberately truncated one.
        const int len = 2 + static_cast<int>(rng() % 3);
        ids.push_back(pick(lead_ids));
        const int conts = len - 1 - static_cast<int>(rng() % 4 == 0);
        for (int k = 0; k < conts; ++k) ids.push_back(pick(cont_ids));
      } else {
        ids.push_back(pick(byte_ids));
      }
    }
    std::vector<size_t> chunks;
    for (size_t left = ids.size(); left > 0;) {
      const size_t c = std::min(left, 1 + static_cast<size_t>(rng() % 4));
      chunks.push_back(c);
      left -= c;
    }
    for (const bool skip : {false, true}) {
      std::string all;
      for (const std::string& p : Stream(tok, ids, chunks, skip)) {
        EXPECT_FALSE(tokenizer::FindInvalidUtf8(p).has_value());
        all += p;
      }
      ASSERT_EQ(all, *tok.Decode(ids, skip)) << "sequence " << s << " skip " << skip;
    }
  }
}

TEST(IncrementalDetokenizerTest, RandomStreamsEqualFullDecodeSpm) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> bytes, leads, conts;
  for (int b = 0; b < 256; ++b) bytes.push_back(3 + b);
  for (int b = 0xC2; b <= 0xF4; ++b) leads.push_back(3 + b);
  for (int b = 0x80; b < 0xC0; ++b) conts.push_back(3 + b);
  CheckRandomStreams(*tok, bytes, leads, conts, {1, 2}, 1);
}

TEST(IncrementalDetokenizerTest, RandomStreamsEqualFullDecodeByteLevel) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> bytes, leads, conts;
  for (int b = 0; b < 256; ++b) bytes.push_back(b);
  for (int b = 0xC2; b <= 0xF4; ++b) leads.push_back(b);
  for (int b = 0x80; b < 0xC0; ++b) conts.push_back(b);
  CheckRandomStreams(*tok, bytes, leads, conts, {300, 301}, 2);
}

TEST(IncrementalDetokenizerTest, RandomStreamsEqualFullDecodeTok512) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  absl::StatusOr<HfTokenizerFiles> files =
      ConvertLlama2cTokenizer(shared / "models" / "stories260K" / "tok512.bin", 512);
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(
      files->tokenizer_json, files->tokenizer_config_json, files->generation_config_json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<int32_t> bytes, leads, conts;
  for (int b = 0; b < 256; ++b) bytes.push_back(3 + b);
  for (int b = 0xC2; b <= 0xF4; ++b) leads.push_back(3 + b);
  for (int b = 0x80; b < 0xC0; ++b) conts.push_back(3 + b);
  CheckRandomStreams(**tok, bytes, leads, conts, {1, 2}, 3);
}

TEST(IncrementalDetokenizerTest, EachPushDecodesOnlyAShortWindow) {
  const auto tok = Load(testing::MiniSpmTokenizerJson());
  ASSERT_NE(tok, nullptr);
  const WindowRecorder recorder(*tok);
  IncrementalDetokenizer detok(recorder);
  std::string all;
  std::vector<int32_t> ids;
  std::mt19937 rng(4);
  for (int i = 0; i < 5000; ++i) {
    // Words, lone spaces (which decode to nothing on their own) and "ü" as two byte tokens,
    // one token per push. A run of byte tokens is decoded whole, so the window must span it:
    // here each run is one character, ended by a word.
    const int32_t choices[] = {267, 269, 260, 259, 270, 271, 3 + 0xC3};
    const int32_t id = choices[rng() % 7];
    for (const int32_t t :
         id == 3 + 0xC3 ? std::vector<int32_t>{id, 3 + 0xBC, 269} : std::vector<int32_t>{id}) {
      ids.push_back(t);
      all += *detok.Push(std::vector<int32_t>{t});
    }
  }
  all += *detok.Flush();
  EXPECT_EQ(all, *tok->Decode(ids));
  EXPECT_LE(recorder.max_window(), 8u);
}

}  // namespace
}  // namespace specd
