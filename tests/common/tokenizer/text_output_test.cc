// TextOutput, the one path from generated ids to streamed text for the coordinator and the CLI:
// the prompt primes the detokenizer (SentencePiece keeps the first word's space), stop strings
// are found across token boundaries and trimmed, and text that may still begin a stop string is
// held back until it cannot.
#include "common/tokenizer/text_output.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"

namespace specd {
namespace {

std::unique_ptr<Tokenizer> Spm() {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(testing::MiniSpmTokenizerJson().dump(), "", "");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Ids of the mini SentencePiece tokenizer (see mini_tokenizers.h).
constexpr int32_t kBos = 1, kThe = 267, kCa = 269, kT = 260;

std::string StreamAll(TextOutput& out, const std::vector<int32_t>& ids) {
  std::string text;
  for (const int32_t id : ids) {
    absl::StatusOr<TextOutput::Chunk> chunk = out.Push(std::span<const int32_t>(&id, 1));
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) break;
    text += chunk->text;
    if (chunk->stopped) return text;
  }
  absl::StatusOr<std::string> tail = out.Finish();
  EXPECT_TRUE(tail.ok());
  return text + tail.value_or("");
}

TEST(TextOutputTest, PromptKeepsTheFirstGeneratedWordsSpace) {
  const std::unique_ptr<Tokenizer> tok = Spm();
  ASSERT_NE(tok, nullptr);
  // After a prompt, " ca" is a continuation and keeps its space.
  const std::vector<int32_t> prompt = {kBos, kThe};
  TextOutput after_prompt(tok.get(), {}, prompt);
  EXPECT_EQ(StreamAll(after_prompt, {kCa, kT}), " cat");
  // After BOS alone, the decoder strips the text's leading space, as Hugging Face and llama2.c do.
  const std::vector<int32_t> bos = {kBos};
  TextOutput from_bos(tok.get(), {}, bos);
  EXPECT_EQ(StreamAll(from_bos, {kCa, kT}), "cat");
}

TEST(TextOutputTest, StopStringAcrossTokensIsFoundAndTrimmed) {
  const std::unique_ptr<Tokenizer> tok = Spm();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> prompt = {kBos};
  // "the cat the": the stop string "cat t" spans three tokens.
  TextOutput out(tok.get(), {"cat t"}, prompt);
  std::string text;
  bool stopped = false;
  size_t used = 0;
  for (const int32_t id : {kThe, kCa, kT, kThe}) {
    absl::StatusOr<TextOutput::Chunk> chunk = out.Push(std::span<const int32_t>(&id, 1));
    ASSERT_TRUE(chunk.ok());
    text += chunk->text;
    if (chunk->stopped) {
      stopped = true;
      used = chunk->tokens_used;
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(used, 1u);  // the stop completed inside the fourth token's text
  EXPECT_EQ(text, "the ");
}

TEST(TextOutputTest, HeldBackTextIsReleasedWhenItCannotStartAStop) {
  const std::unique_ptr<Tokenizer> tok = Spm();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> prompt = {kBos};
  TextOutput out(tok.get(), {" cax"}, prompt);
  const int32_t the = kThe;
  absl::StatusOr<TextOutput::Chunk> first = out.Push(std::span<const int32_t>(&the, 1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->text, "the");
  const int32_t ca = kCa;
  absl::StatusOr<TextOutput::Chunk> second = out.Push(std::span<const int32_t>(&ca, 1));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->text, "");  // " ca" may still become " cax"
  const int32_t t = kT;
  absl::StatusOr<TextOutput::Chunk> third = out.Push(std::span<const int32_t>(&t, 1));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->text, " cat");
  EXPECT_FALSE(third->stopped);
}

}  // namespace
}  // namespace specd
