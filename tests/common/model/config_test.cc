// ParseModelConfig on real configs (Llama-3.2-1B-Instruct, a stories260K conversion), every
// rejection, the JSON round trip, and RopeInvFreq against a numpy float32 reference of
// transformers' RoPE code (rope_reference.py).
#include "common/model/config.h"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/model_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// meta-llama/Llama-3.2-1B-Instruct config.json, as published.
constexpr char kLlama32_1B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// What a conversion of llama2.c's stories260K (dim 64, hidden_dim 172, 5 layers, 8 heads,
// 4 kv heads, vocab 512, seq_len 512, shared classifier) looks like: no head_dim, no rope fields.
constexpr char kStories260K[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 64,
  "intermediate_size": 172,
  "num_hidden_layers": 5,
  "num_attention_heads": 8,
  "num_key_value_heads": 4,
  "vocab_size": 512,
  "max_position_embeddings": 512,
  "rms_norm_eps": 1e-05,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "tie_word_embeddings": true,
  "torch_dtype": "float32"
})";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ParseModelConfigTest, Llama32_1BInstruct) {
  const absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama32_1B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 8192);
  EXPECT_EQ(c->num_layers, 16);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->q_dim(), 2048);
  EXPECT_EQ(c->kv_dim(), 512);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_ids, std::vector<int32_t>{128000});
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c->torch_dtype, kernels::DType::kBF16);
}

TEST(ParseModelConfigTest, Stories260KDefaults) {
  const absl::StatusOr<ModelConfig> c = ParseModelConfig(kStories260K);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);  // hidden_size / num_attention_heads
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->bos_token_ids, std::vector<int32_t>{1});
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(c->torch_dtype, kernels::DType::kF32);
}

TEST(ParseModelConfigTest, OptionalFieldsDefaultLikeTransformers) {
  json j = json::parse(kStories260K);
  for (const char* field : {"num_key_value_heads", "tie_word_embeddings", "bos_token_id",
                            "eos_token_id", "torch_dtype", "model_type"}) {
    j.erase(field);
  }
  j["rope_scaling"] = nullptr;
  j["head_dim"] = nullptr;
  const absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->torch_dtype, kernels::DType::kF32);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ParseModelConfigTest, AcceptsOlderAndNewerRopeSpellings) {
  // Before transformers 4.43 the key was "type".
  json j = json::parse(kLlama32_1B);
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);

  // transformers 5 puts rope_theta and the scaling into rope_parameters, and says "dtype".
  j = json::parse(kLlama32_1B);
  json params = j["rope_scaling"];
  params["rope_theta"] = 500000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  j["rope_parameters"] = params;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->torch_dtype, kernels::DType::kF16);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->rope_theta, 1e6);
}

struct BadConfig {
  std::string name;
  std::function<void(json&)> mutate;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

class ParseModelConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ParseModelConfigErrorTest, RejectsWithAClearMessage) {
  json j = json::parse(kLlama32_1B);
  GetParam().mutate(j);
  const absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok()) << j.dump();
  EXPECT_EQ(c.status().code(), GetParam().code) << c.status();
  EXPECT_THAT(Message(c.status()), ::testing::StartsWith("config.json: "));
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_THAT(Message(c.status()), HasSubstr(part));
  }
}

std::function<void(json&)> Erase(const std::string& field) {
  return [field](json& j) { j.erase(field); };
}

std::function<void(json&)> Set(const std::string& field, json value) {
  return [field, value](json& j) { j[field] = value; };
}

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    All, ParseModelConfigErrorTest,
    ::testing::ValuesIn(std::vector<BadConfig>{
        {"MissingVocab", Erase("vocab_size"), kInvalid, {"vocab_size is missing"}},
        {"MissingHidden", Erase("hidden_size"), kInvalid, {"hidden_size is missing"}},
        {"MissingIntermediate",
         Erase("intermediate_size"),
         kInvalid,
         {"intermediate_size is missing"}},
        {"MissingLayers", Erase("num_hidden_layers"), kInvalid, {"num_hidden_layers is missing"}},
        {"MissingHeads",
         Erase("num_attention_heads"),
         kInvalid,
         {"num_attention_heads is missing"}},
        {"MissingMaxPos",
         Erase("max_position_embeddings"),
         kInvalid,
         {"max_position_embeddings is missing"}},
        {"MissingEps", Erase("rms_norm_eps"), kInvalid, {"rms_norm_eps is missing"}},
        {"NoArchitecture",
         [](json& j) {
           j.erase("architectures");
           j.erase("model_type");
         },
         kInvalid,
         {"architectures is missing", "LlamaForCausalLM"}},
        {"WrongArchitecture",
         Set("architectures", {"MistralForCausalLM"}),
         kInvalid,
         {"architectures must contain \"LlamaForCausalLM\"", "MistralForCausalLM"}},
        {"WrongModelType",
         Set("model_type", "mistral"),
         kInvalid,
         {"model_type must be \"llama\"", "mistral"}},
        {"HeadsDoNotDivideHidden",
         [](json& j) {
           j.erase("head_dim");
           j["hidden_size"] = 64;
           j["num_attention_heads"] = 7;
           j["num_key_value_heads"] = 7;
         },
         kInvalid,
         {"num_attention_heads (7) must divide hidden_size (64) when head_dim is absent"}},
        {"KvHeadsDoNotDivideHeads",
         Set("num_key_value_heads", 5),
         kInvalid,
         {"num_key_value_heads (5) must divide num_attention_heads (32)"}},
        {"OddHeadDim", Set("head_dim", 63), kInvalid, {"head_dim (63) must be even"}},
        {"ZeroLayers",
         Set("num_hidden_layers", 0),
         kInvalid,
         {"num_hidden_layers (0) must be at least 1"}},
        {"NegativeVocab", Set("vocab_size", -5), kInvalid, {"vocab_size (-5) must be at least 1"}},
        {"AbsurdLayers",
         Set("num_hidden_layers", (1 << 20) + 1),
         kInvalid,
         {"num_hidden_layers", "exceeds the limit of 1048576"}},
        {"HugeVocab",
         Set("vocab_size", int64_t{1} << 40),
         kInvalid,
         {"vocab_size", "exceeds the limit"}},
        {"HugeUnsigned",
         Set("hidden_size", uint64_t{18446744073709551615u}),
         kInvalid,
         {"hidden_size", "exceeds the limit"}},
        {"MatrixTooLarge",
         [](json& j) {
           j["vocab_size"] = 2000000000;
           j["hidden_size"] = 16000000;
           j["num_attention_heads"] = 250000;
         },
         kInvalid,
         {"vocab_size x hidden_size", "1099511627776"}},
        {"FloatForInt",
         Set("hidden_size", 2048.0),
         kInvalid,
         {"hidden_size must be an integer, got 2048.0"}},
        {"BoolForInt",
         Set("num_hidden_layers", true),
         kInvalid,
         {"num_hidden_layers must be an integer"}},
        {"StringForInt", Set("vocab_size", "128256"), kInvalid, {"vocab_size must be an integer"}},
        {"ZeroEps", Set("rms_norm_eps", 0.0), kInvalid, {"rms_norm_eps", "finite number > 0"}},
        {"StringEps", Set("rms_norm_eps", "1e-5"), kInvalid, {"rms_norm_eps must be a number"}},
        {"NegativeTheta", Set("rope_theta", -1.0), kInvalid, {"rope_theta", "> 0"}},
        {"EosOutOfVocab",
         Set("eos_token_id", {128001, 128256}),
         kInvalid,
         {"eos_token_id", "[0, 128256)"}},
        {"NegativeBos", Set("bos_token_id", -1), kInvalid, {"bos_token_id"}},
        {"StringBos", Set("bos_token_id", "<s>"), kInvalid, {"bos_token_id"}},
        {"Gelu", Set("hidden_act", "gelu"), kInvalid, {"hidden_act \"gelu\" is not supported"}},
        {"AttentionBias", Set("attention_bias", true), kInvalid, {"attention_bias is true"}},
        {"MlpBias", Set("mlp_bias", true), kInvalid, {"mlp_bias is true"}},
        {"BiasNotBool", Set("mlp_bias", 0), kInvalid, {"mlp_bias must be true or false"}},
        {"TieNotBool", Set("tie_word_embeddings", "yes"), kInvalid, {"tie_word_embeddings"}},
        {"Float64",
         Set("torch_dtype", "float64"),
         kInvalid,
         {"torch_dtype \"float64\" is not supported"}},
        {"YarnRope",
         [](json& j) { j["rope_scaling"]["rope_type"] = "yarn"; },
         absl::StatusCode::kUnimplemented,
         {"rope_scaling.rope_type \"yarn\" is not supported", "llama3"}},
        {"LinearRopeOldKey",
         Set("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}),
         absl::StatusCode::kUnimplemented,
         {"\"linear\" is not supported"}},
        {"RopeNoType",
         Set("rope_scaling", {{"factor", 2.0}}),
         kInvalid,
         {"rope_scaling.rope_type is missing"}},
        {"RopeNotObject",
         Set("rope_scaling", "llama3"),
         kInvalid,
         {"rope_scaling must be an object or null"}},
        {"Llama3MissingFactor",
         [](json& j) { j["rope_scaling"].erase("factor"); },
         kInvalid,
         {"rope_scaling.factor is missing"}},
        {"Llama3MissingOriginal",
         [](json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); },
         kInvalid,
         {"rope_scaling.original_max_position_embeddings is missing"}},
        {"Llama3FreqFactorsEqual",
         [](json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; },
         kInvalid,
         {"rope_scaling.high_freq_factor (1) must be greater than low_freq_factor (1)"}},
        {"Llama3NegativeFactor",
         [](json& j) { j["rope_scaling"]["factor"] = -8.0; },
         kInvalid,
         {"rope_scaling.factor"}},
    }),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.name; });

TEST(ParseModelConfigTest, RejectsNonJson) {
  for (const char* text : {"", "{", "[1,2]", "null", "\"config\""}) {
    const absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), kInvalid);
    EXPECT_THAT(Message(c.status()), ::testing::StartsWith("config.json"));
  }
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_ids, b.bos_token_ids);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
}

TEST(ModelConfigToJsonTest, RoundTripsAndReadsAsHuggingFaceConfig) {
  for (const char* text : {kLlama32_1B, kStories260K}) {
    const absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string out = ModelConfigToJson(*c);
    const absl::StatusOr<ModelConfig> back = ParseModelConfig(out);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << out;
    ExpectSameConfig(*c, *back);
    // The fields Hugging Face tools read, under their Hugging Face names.
    const json j = json::parse(out);
    const json original = json::parse(text);
    for (const char* field :
         {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
          "bos_token_id", "eos_token_id", "tie_word_embeddings", "torch_dtype"}) {
      EXPECT_EQ(j[field], original[field]) << field;
    }
    EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(j["model_type"], "llama");
  }
  // Awkward doubles survive the text round trip bit for bit.
  ModelConfig c = *ParseModelConfig(kStories260K);
  c.rms_norm_eps = 1.0 / 3.0;
  c.rope_theta = 123456.789e-3;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 7.7, 0.3, 2.9, 4096};
  c.eos_token_ids = {};
  c.bos_token_ids = {3, 4};
  const absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameConfig(c, *back);
}

TEST(LoadModelConfigTest, ReadsTheDirectoryAndNamesThePathInErrors) {
  testing::ScopedTempDir dir;
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir.path());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(c.status()), HasSubstr((dir.path() / "config.json").string()));

  testing::WriteFileBytes(dir.path() / "config.json", kStories260K);
  c = LoadModelConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 5);

  testing::WriteFileBytes(dir.path() / "config.json", R"({"architectures": ["LlamaForCausalLM"]})");
  c = LoadModelConfig(dir.path());
  EXPECT_EQ(c.status().code(), kInvalid);
  EXPECT_THAT(Message(c.status()),
              HasSubstr((dir.path() / "config.json").string() + ": vocab_size is missing"));

  // A single-file checkpoint where the directory goes is named, with the way to convert it.
  c = LoadModelConfig(dir.path() / "config.json");
  EXPECT_EQ(c.status().code(), kInvalid);
  EXPECT_THAT(Message(c.status()), HasSubstr("config.json is a file; a model is a directory"));
  EXPECT_THAT(Message(c.status()), HasSubstr("specd convert llama2c"));
}

// Units in the last place between two finite floats of the same sign.
int64_t UlpDistance(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<uint32_t>(a)) -
                  static_cast<int64_t>(std::bit_cast<uint32_t>(b)));
}

TEST(RopeInvFreqTest, MatchesNumpyFloat32Reference) {
  std::vector<ModelConfig> configs;
  configs.push_back(*ParseModelConfig(kLlama32_1B));   // llama3 scaling, factor 32, theta 5e5
  configs.push_back(*ParseModelConfig(kStories260K));  // default, head_dim 8
  ModelConfig llama31_8b = configs[0];                 // Llama 3.1 8B: factor 8, head_dim 128
  llama31_8b.head_dim = 128;
  llama31_8b.rope_scaling.factor = 8.0;
  configs.push_back(llama31_8b);
  ModelConfig llama2 = configs[1];  // Llama 2 7B: head_dim 128, theta 1e4
  llama2.head_dim = 128;
  configs.push_back(llama2);
  ModelConfig odd = configs[0];  // non-integer parameters exercise every rounding step
  odd.head_dim = 96;
  odd.rope_theta = 123456.7;
  odd.rope_scaling = {RopeScaling::Type::kLlama3, 5.5, 1.5, 6.25, 3000};
  configs.push_back(odd);

  json cases = json::array();
  for (const ModelConfig& c : configs) {
    json rope = nullptr;
    if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
      rope = {
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    }
    cases.push_back(
        {{"head_dim", c.head_dim}, {"rope_theta", c.rope_theta}, {"rope_scaling", rope}});
  }
  testing::ScopedTempDir dir;
  testing::WriteFileBytes(dir.path() / "cases.json", cases.dump());
  const json expected =
      json::parse(testing::RunPython("rope_reference.py", {(dir.path() / "cases.json").string()}),
                  nullptr, false);
  ASSERT_TRUE(expected.is_array());
  ASSERT_EQ(expected.size(), configs.size());

  for (size_t k = 0; k < configs.size(); ++k) {
    SCOPED_TRACE(cases[k].dump());
    const std::vector<float> got = RopeInvFreq(configs[k]);
    const std::vector<uint32_t> bits = expected[k].get<std::vector<uint32_t>>();
    ASSERT_EQ(got.size(), bits.size());
    ASSERT_EQ(got.size(), static_cast<size_t>(configs[k].head_dim / 2));
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = std::bit_cast<float>(bits[i]);
      EXPECT_EQ(UlpDistance(got[i], want), 0)
          << "pair " << i << ": got " << got[i] << " want " << want;
    }
  }
}

}  // namespace
}  // namespace specd
