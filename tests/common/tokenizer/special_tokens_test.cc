// BOS/EOS from tokenizer_config.json, generation_config.json and the post-processor template.
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"

namespace specd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> Load(const nlohmann::json& tokenizer_json, const std::string& config,
                                const std::string& generation) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(tokenizer_json.dump(), config, generation);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(SpecialTokensTest, AddBosTokenOverridesTheTemplateAndOptionsOverrideBoth) {
  const auto tok = Load(testing::MiniSpmTokenizerJson(), R"({"add_bos_token": false})", "");
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(*tok->Encode("the"), ElementsAre(267));
  EXPECT_THAT(*tok->Encode("the", {.add_bos = true}), ElementsAre(1, 267));
  const auto templ = Load(testing::MiniSpmTokenizerJson(), "", "");
  ASSERT_NE(templ, nullptr);
  EXPECT_EQ(templ->bos_id(), 1);  // from the template alone
  EXPECT_THAT(*templ->Encode("the"), ElementsAre(1, 267));
}

TEST(SpecialTokensTest, Llama3StyleConfigs) {
  // Llama 3 names BOS/EOS by content, lists several EOS ids, and has no add_bos_token.
  const auto tok = Load(testing::MiniByteLevelTokenizerJson(),
                        R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})",
                        R"({"bos_token_id": 300, "eos_token_id": [301, 255, 301]})");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 300);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{255, 301}));
  EXPECT_THAT(*tok->Encode("the"), ElementsAre('t', 257));  // ByteLevel post-processor: no BOS
  EXPECT_THAT(*tok->Encode("the", {.add_bos = true}), ElementsAre(300, 't', 257));
}

TEST(SpecialTokensTest, TokenObjectsIntegerEosAndTemplateInASequence) {
  nlohmann::json j = testing::MiniByteLevelTokenizerJson();
  const nlohmann::json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}},
        {{"type", "TemplateProcessing"},
         {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", nlohmann::json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {300}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const auto tok = Load(j,
                        R"({"eos_token": {"__type": "AddedToken", "content": "<|eot_id|>",
                            "lstrip": false, "normalized": false, "rstrip": false,
                            "single_word": false, "special": true}})",
                        R"({"eos_token_id": 301})");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 300);
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{301});
  EXPECT_THAT(*tok->Encode("the"), ElementsAre(300, 't', 257));
}

TEST(SpecialTokensTest, GenerationConfigBosWhenTokenizerConfigHasNone) {
  const auto tok = Load(testing::MiniByteLevelTokenizerJson(), R"({"add_bos_token": true})",
                        R"({"bos_token_id": 300})");
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(*tok->Encode("a"), ElementsAre(300, 'a'));
}

TEST(SpecialTokensTest, AddBosWithoutABosIsAnError) {
  const absl::Status s = Tokenizer::FromJson(testing::MiniByteLevelTokenizerJson().dump(),
                                             R"({"add_bos_token": true})", "")
                             .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("add_bos_token is true but no BOS token is configured"));
  const auto tok = Load(testing::MiniByteLevelTokenizerJson(), "", "");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_EQ(tok->Encode("a", {.add_bos = true}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace specd
