// Loading: every malformed or unsupported declaration is INVALID_ARGUMENT naming the file, the
// component and the field.
#include <fstream>
#include <functional>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/mini_tokenizers.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;

absl::Status LoadStatus(const std::string& tokenizer_json, const std::string& config = "",
                        const std::string& generation = "") {
  return Tokenizer::FromJson(tokenizer_json, config, generation).status();
}

struct BadCase {
  std::string name;
  std::function<void(Json&)> edit;
  std::string message;
};

TEST(TokenizerLoadTest, RejectsMalformedJson) {
  const std::string good = testing::MiniSpmTokenizerJson().dump();
  for (const std::string& text :
       {std::string("{"), good.substr(0, good.size() / 2), std::string("")}) {
    const absl::Status s = LoadStatus(text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), StartsWith("tokenizer.json: invalid JSON"));
  }
  EXPECT_THAT(std::string(LoadStatus("[1, 2]").message()),
              HasSubstr("tokenizer.json: must be a JSON object"));
}

TEST(TokenizerLoadTest, RejectsUnsupportedOrInvalidComponents) {
  const Json spm = testing::MiniSpmTokenizerJson();
  const Json bl = testing::MiniByteLevelTokenizerJson();
  const std::vector<std::pair<Json, BadCase>> cases = {
      {spm,
       {"no model", [](Json& j) { j.erase("model"); }, "tokenizer.json: missing field 'model'"}},
      {spm,
       {"unigram", [](Json& j) { j["model"]["type"] = "Unigram"; },
        "tokenizer.json: model type 'Unigram' is not supported"}},
      {spm,
       {"digits",
        [](Json& j) {
          j["pre_tokenizer"] = {{"type", "Digits"}};
        },
        "tokenizer.json: pre_tokenizer type 'Digits' is not supported"}},
      {bl,
       {"nested whitespace",
        [](Json& j) {
          j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
        },
        "tokenizer.json: pre_tokenizer.pretokenizers[1] type 'Whitespace' is not supported"}},
      {spm,
       {"nfc",
        [](Json& j) {
          j["normalizer"]["normalizers"][0] = {{"type", "NFC"}};
        },
        "tokenizer.json: normalizer.normalizers[0] type 'NFC' is not supported"}},
      {spm,
       {"regex replace",
        [](Json& j) {
          j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
        },
        "normalizer.normalizers[1]: Regex patterns are not supported here"}},
      {spm,
       {"wordpiece decoder",
        [](Json& j) {
          j["decoder"] = {{"type", "WordPiece"}};
        },
        "tokenizer.json: decoder type 'WordPiece' is not supported"}},
      {spm,
       {"bert processor",
        [](Json& j) {
          j["post_processor"] = {{"type", "BertProcessing"}};
        },
        "tokenizer.json: post_processor type 'BertProcessing' is not supported"}},
      {bl,
       {"split removed",
        [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
        "pre_tokenizer.pretokenizers[0]: Split behavior 'Removed' is not supported"}},
      {bl,
       {"split invert", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
        "Split with invert true is not supported"}},
      {bl,
       {"bad regex",
        [](Json& j) {
          j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(a"}};
        },
        "pre_tokenizer.pretokenizers[0]: cannot compile regex pattern '(a'"}},
      {spm,
       {"metaspace scheme",
        [](Json& j) {
          j["pre_tokenizer"] = {{"type", "Metaspace"},
                                {"replacement", testing::kSpm},
                                {"prepend_scheme", "sometimes"}};
        },
        "pre_tokenizer: prepend_scheme 'sometimes' is not one of always, first, never"}},
      {spm,
       {"metaspace replacement",
        [](Json& j) {
          j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
        },
        "field 'replacement' must be exactly one character"}},
      {spm,
       {"subword prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
        "model: continuing_subword_prefix '##' is not supported"}},
      {spm,
       {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; },
        "model: dropout must be null or 0"}},
      {spm,
       {"unknown merge", [](Json& j) { j["model"]["merges"][2] = "q e"; },
        "merges[2] ('q', 'e'): the left part 'q' is not in the vocabulary"}},
      {spm,
       {"three-part merge", [](Json& j) { j["model"]["merges"][0] = "a b c"; },
        "merges[0] 'a b c' must be two tokens separated by one space"}},
      {spm,
       {"negative id", [](Json& j) { j["model"]["vocab"]["t"] = -4; },
        "vocab entry 't' must have a non-negative integer id"}},
      {spm, {"shared id", [](Json& j) { j["model"]["vocab"]["zz"] = 5; }, "to id 5"}},
      {spm,
       {"unk missing", [](Json& j) { j["model"]["unk_token"] = "<nope>"; },
        "unk_token '<nope>' is not in the vocabulary"}},
      {spm,
       {"added id clash", [](Json& j) { j["added_tokens"][1]["id"] = 7; },
        "added_tokens[1]: '<s>' has id 7 but the vocabulary gives it id 1"}},
      {spm,
       {"added twice", [](Json& j) { j["added_tokens"].push_back(j["added_tokens"][0]); },
        "added_tokens[3]: '<unk>' is listed twice"}},
      {spm,
       {"eos in template",
        [](Json& j) { j["post_processor"]["single"].push_back(j["post_processor"]["single"][0]); },
        "special tokens after $A (appended to every prompt) are not supported"}},
      {spm,
       {"truncation",
        [](Json& j) {
          j["truncation"] = {{"max_length", 8}};
        },
        "tokenizer.json: truncation: must be null"}},
      {spm,
       {"wrong type", [](Json& j) { j["model"]["byte_fallback"] = "yes"; },
        "tokenizer.json: model: field 'byte_fallback' must be true or false, got string"}},
  };
  for (const auto& [base, c] : cases) {
    SCOPED_TRACE(c.name);
    Json j = base;
    c.edit(j);
    const absl::Status s = LoadStatus(j.dump());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

TEST(TokenizerLoadTest, RejectsBadConfigFiles) {
  const std::string spm = testing::MiniSpmTokenizerJson().dump();
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"{", "", "tokenizer_config.json: invalid JSON"},
      {R"({"add_bos_token": "yes"})", "",
       "tokenizer_config.json: field 'add_bos_token' must be true or false, got string"},
      {R"({"add_eos_token": true})", "", "add_eos_token true is not supported"},
      {R"({"bos_token": "<b>"})", "", "tokenizer_config.json: bos_token '<b>' is not in"},
      {R"({"eos_token": 5})", "", "field 'eos_token' must be a string or an object"},
      {R"({"eos_token": {"lstrip": false}})", "",
       "tokenizer_config.json: eos_token: missing field 'content'"},
      {"", "[", "generation_config.json: invalid JSON"},
      {"", R"({"eos_token_id": ["2"]})",
       "generation_config.json: eos_token_id[0] must be an integer"},
      {"", R"({"eos_token_id": 9999})",
       "generation_config.json: eos_token_id 9999 is not a token id"},
      {"", R"({"bos_token_id": 1.5})", "field 'bos_token_id' must be an integer"},
  };
  for (const auto& [config, generation, message] : cases) {
    SCOPED_TRACE(message);
    const absl::Status s = LoadStatus(spm, config, generation);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
}

TEST(TokenizerLoadTest, LoadsADirectoryAndNamesMissingFiles) {
  testing::ScopedTempDir dir;
  const absl::StatusOr<std::unique_ptr<Tokenizer>> missing = Tokenizer::LoadFromDir(dir.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("tokenizer.json: file not found"));

  std::ofstream(dir.path() / "tokenizer.json") << testing::MiniSpmTokenizerJson().dump();
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"add_bos_token": false})";
  std::ofstream(dir.path() / "generation_config.json") << R"({"eos_token_id": 2})";
  const absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("the"), std::vector<int32_t>{267});
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{2});

  std::ofstream(dir.path() / "tokenizer_config.json") << "{oops";
  const absl::StatusOr<std::unique_ptr<Tokenizer>> bad = Tokenizer::LoadFromDir(dir.path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(dir.path().string() + ": tokenizer_config.json"));
}

}  // namespace
}  // namespace specd
