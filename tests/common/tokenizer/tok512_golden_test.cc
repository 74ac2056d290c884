// The TinyStories tok512 tokenizer, converted from llama2.c's tokenizer.bin, against the golden
// output of llama2.c's run.c (an independent implementation of the same SentencePiece BPE).
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/llama2c_import.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specd {
namespace {

// llama2.c's tokenizer.bin in `dir`, converted as `specd convert` does.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTok512(const std::filesystem::path& dir) {
  absl::StatusOr<HfTokenizerFiles> files = ConvertLlama2cTokenizer(dir / "tok512.bin", 512);
  if (!files.ok()) return files.status();
  return Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json,
                             files->generation_config_json);
}

TEST(Tok512GoldenTest, EncodesPromptsAndDecodesGenerationsLikeLlama2c) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  const std::filesystem::path dir = shared / "models" / "stories260K";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTok512(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 512);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{2});

  std::ifstream in(dir / "golden-greedy.json");
  ASSERT_TRUE(in) << "cannot open golden-greedy.json";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json golden = nlohmann::json::parse(buffer.str(), nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  ASSERT_GE(golden["cases"].size(), 1u);
  for (const nlohmann::json& c : golden["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const std::vector<int32_t> token_ids = c["token_ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE("prompt: '" + prompt + "'");
    // Default options: tokenizer_config.json's add_bos_token (true) must apply.
    absl::StatusOr<std::vector<int32_t>> encoded = (*tok)->Encode(prompt);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    ASSERT_LE(encoded->size(), token_ids.size());
    EXPECT_EQ(*encoded,
              std::vector<int32_t>(token_ids.begin(), token_ids.begin() + encoded->size()));
    if (prompt.empty()) {
      EXPECT_EQ(*encoded, std::vector<int32_t>{1});
    }
    absl::StatusOr<std::string> decoded =
        (*tok)->Decode(std::span<const int32_t>(token_ids).subspan(1));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    // run.c prints every token after BOS, then one "\n" of its own when generation ends.
    const std::string text = c["text"].get<std::string>();
    ASSERT_TRUE(text.ends_with("\n"));
    EXPECT_EQ(*decoded, text.substr(0, text.size() - 1));
  }
}

// A generation's text encoded as a continuation (EncodeOptions::continuation) is the tokens the
// prompt and text encode to together, after the prompt's: what a predicted output needs. Encoded
// plainly, SentencePiece's dummy prefix puts a "▁" first that the longer text does not have.
TEST(Tok512GoldenTest, ContinuationEncodesAsInsideTheLongerText) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  const std::filesystem::path dir = shared / "models" / "stories260K";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTok512(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::ifstream in(dir / "golden-greedy.json");
  ASSERT_TRUE(in) << "cannot open golden-greedy.json";
  const nlohmann::json golden = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  EncodeOptions continuation;
  continuation.add_bos = false;
  continuation.continuation = true;
  EncodeOptions plain;
  plain.add_bos = false;
  int checked = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    if (prompt.empty()) continue;
    std::string text = c["text"].get<std::string>();
    text.pop_back();  // run.c's own final newline
    // `text` repeats the prompt; the generation is the rest, cut at a word boundary.
    ASSERT_TRUE(text.starts_with(prompt));
    const std::string rest = text.substr(prompt.size());
    SCOPED_TRACE("prompt: '" + prompt + "'");
    absl::StatusOr<std::vector<int32_t>> whole = (*tok)->Encode(text);
    absl::StatusOr<std::vector<int32_t>> head = (*tok)->Encode(prompt);
    absl::StatusOr<std::vector<int32_t>> tail = (*tok)->Encode(rest, continuation);
    absl::StatusOr<std::vector<int32_t>> tail_plain = (*tok)->Encode(rest, plain);
    ASSERT_TRUE(whole.ok() && head.ok() && tail.ok() && tail_plain.ok());
    ASSERT_LE(head->size(), whole->size());
    if (!std::equal(head->begin(), head->end(), whole->begin())) continue;  // merged across
    EXPECT_EQ(*tail, std::vector<int32_t>(whole->begin() + head->size(), whole->end()));
    EXPECT_NE(*tail_plain, *tail);
    ++checked;
  }
  EXPECT_GE(checked, 2) << "no golden case splits at its prompt";
}

}  // namespace
}  // namespace specd
