// LoadModelWeights over tiny Llama checkpoints written by the independent Python writer
// (st_write.py llama), which names and shapes tensors as transformers' LlamaForCausalLM does.
#include "common/model/weights.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
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

constexpr int64_t kVocab = 64, kHidden = 16, kInter = 40, kLayers = 3, kHeads = 4, kKvHeads = 2,
                  kHeadDim = 4;

json TinyConfig(bool tied) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", kVocab},
          {"hidden_size", kHidden},
          {"intermediate_size", kInter},
          {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-5},
          {"tie_word_embeddings", tied},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

// Writes config.json and a checkpoint for it with st_write.py; returns the manifest.
json WriteCheckpoint(const std::filesystem::path& dir, const json& config,
                     const std::vector<std::string>& flags = {}) {
  testing::WriteFileBytes(dir / "config.json", config.dump(2));
  std::vector<std::string> args = {"llama", dir.string()};
  args.insert(args.end(), flags.begin(), flags.end());
  testing::RunPython("st_write.py", args);
  return testing::ReadJson(dir / "manifest.json");
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

void ExpectMatrix(const kernels::WeightView& w, const json& manifest, const std::string& name,
                  int64_t rows, int64_t cols) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(manifest.contains(name));
  const json& t = manifest[name];
  EXPECT_EQ(w.rows, rows);
  EXPECT_EQ(w.cols, cols);
  EXPECT_EQ(kernels::DTypeName(w.dtype), t["dtype"].get<std::string>());
  const std::string expected = testing::HexToBytes(t["hex"].get<std::string>());
  ASSERT_EQ(static_cast<int64_t>(expected.size()), rows * cols * kernels::DTypeSize(w.dtype));
  ASSERT_NE(w.data, nullptr);
  EXPECT_EQ(std::memcmp(w.data, expected.data(), expected.size()), 0);
}

void ExpectVector(const std::vector<float>& v, const json& manifest, const std::string& name) {
  SCOPED_TRACE(name);
  const std::vector<double> expected = manifest[name]["values"];
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(static_cast<double>(v[i]), expected[i]) << i;
}

void ExpectModel(const ModelWeights& w, const json& m, int64_t layers) {
  ExpectMatrix(w.embed, m, "model.embed_tokens.weight", kVocab, kHidden);
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), layers);
  for (int64_t i = 0; i < layers; ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    ExpectMatrix(l.wq, m, p + "self_attn.q_proj.weight", kHeads * kHeadDim, kHidden);
    ExpectMatrix(l.wk, m, p + "self_attn.k_proj.weight", kKvHeads * kHeadDim, kHidden);
    ExpectMatrix(l.wv, m, p + "self_attn.v_proj.weight", kKvHeads * kHeadDim, kHidden);
    ExpectMatrix(l.wo, m, p + "self_attn.o_proj.weight", kHidden, kHeads * kHeadDim);
    ExpectMatrix(l.w_gate, m, p + "mlp.gate_proj.weight", kInter, kHidden);
    ExpectMatrix(l.w_up, m, p + "mlp.up_proj.weight", kInter, kHidden);
    ExpectMatrix(l.w_down, m, p + "mlp.down_proj.weight", kHidden, kInter);
    ExpectVector(l.attn_norm, m, p + "input_layernorm.weight");
    ExpectVector(l.ffn_norm, m, p + "post_attention_layernorm.weight");
  }
  ExpectVector(w.final_norm, m, "model.norm.weight");
}

TEST(LoadModelWeightsTest, BindsEveryTensorUntied) {
  testing::ScopedTempDir dir;
  const json m = WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/false));
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config.num_layers, kLayers);
  EXPECT_EQ((*w)->config.head_dim, kHeadDim);
  ExpectModel(**w, m, kLayers);
  ExpectMatrix((*w)->lm_head, m, "lm_head.weight", kVocab, kHidden);
  EXPECT_NE((*w)->lm_head.data, (*w)->embed.data);
  EXPECT_NE((*w)->checkpoint, nullptr);
}

TEST(LoadModelWeightsTest, MixedDtypesAndShards) {
  testing::ScopedTempDir dir;
  const json m = WriteCheckpoint(
      dir.path(), TinyConfig(/*tied=*/false),
      {"--dtype", "BF16", "--shards", "3", "--set", "model.layers.0.self_attn.q_proj.weight=F32",
       "--set", "model.layers.1.mlp.down_proj.weight=F16", "--set",
       "model.layers.2.input_layernorm.weight=F16", "--set", "model.norm.weight=F32"});
  ASSERT_TRUE(std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectModel(**w, m, kLayers);
  EXPECT_EQ((*w)->layers[0].wq.dtype, kernels::DType::kF32);
  EXPECT_EQ((*w)->layers[0].wk.dtype, kernels::DType::kBF16);
  EXPECT_EQ((*w)->layers[1].w_down.dtype, kernels::DType::kF16);
  ExpectMatrix((*w)->lm_head, m, "lm_head.weight", kVocab, kHidden);
}

TEST(LoadModelWeightsTest, TiedEmbeddingsShareTheTable) {
  testing::ScopedTempDir dir;
  const json m = WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/true));
  ASSERT_FALSE(m.contains("lm_head.weight"));
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectModel(**w, m, kLayers);
  EXPECT_EQ((*w)->lm_head.data, (*w)->embed.data);
  EXPECT_EQ((*w)->lm_head.rows, kVocab);
  EXPECT_EQ((*w)->lm_head.cols, kHidden);
}

TEST(LoadModelWeightsTest, TiedIgnoresAStoredLmHead) {
  testing::ScopedTempDir dir;
  // transformers ties lm_head to the embedding after loading, so a stored copy never counts.
  const json m = WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/true),
                                 {"--lm-head", "--shape", "lm_head.weight=3,3"});
  ASSERT_TRUE(m.contains("lm_head.weight"));
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->lm_head.data, (*w)->embed.data);
}

TEST(LoadModelWeightsTest, ExitLayerKeepsTheFirstLayersAndTheCheckpointHead) {
  testing::ScopedTempDir dir;
  const json m = WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/false));
  LoadOptions options;
  options.exit_layer = 2;
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path(), options);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config.num_layers, 2);
  ExpectModel(**w, m, 2);
  ExpectMatrix((*w)->lm_head, m, "lm_head.weight", kVocab, kHidden);

  options.exit_layer = kLayers;
  ASSERT_TRUE(LoadModelWeights(dir.path(), options).ok());
  for (const int64_t bad : {int64_t{-1}, kLayers + 1}) {
    options.exit_layer = bad;
    const absl::StatusOr<std::unique_ptr<ModelWeights>> e = LoadModelWeights(dir.path(), options);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(e.status()),
                HasSubstr("exit_layer (" + std::to_string(bad) + ") must be in [1, 3]"));
  }
}

TEST(LoadModelWeightsTest, ReportsProgressUpToTheTotal) {
  testing::ScopedTempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/true));
  std::vector<std::pair<int64_t, int64_t>> calls;
  LoadOptions options;
  options.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  ASSERT_TRUE(LoadModelWeights(dir.path(), options).ok());
  const int64_t total = 2 + 9 * kLayers;  // embed, 9 per layer, final norm; tied: no lm_head
  ASSERT_FALSE(calls.empty());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, total);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
  EXPECT_EQ(calls.back().first, total);
}

TEST(LoadModelWeightsTest, MissingTensorsAreNotFound) {
  testing::ScopedTempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/false),
                  {"--omit", "model.layers.1.mlp.up_proj.weight"});
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(w.status()), HasSubstr("model.layers.1.mlp.up_proj.weight"));
  EXPECT_THAT(Message(w.status()), HasSubstr((dir.path() / "model.safetensors").string()));

  testing::ScopedTempDir untied;
  WriteCheckpoint(untied.path(), TinyConfig(/*tied=*/false), {"--omit", "lm_head.weight"});
  w = LoadModelWeights(untied.path());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(w.status()), HasSubstr("tensor lm_head.weight not found"));
}

TEST(LoadModelWeightsTest, ShapeMismatchNamesTensorFileAndConfigFields) {
  testing::ScopedTempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/false),
                  {"--shape", "model.layers.2.self_attn.k_proj.weight=16,16"});
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(w.status()),
              HasSubstr((dir.path() / "model.safetensors").string() +
                        ": tensor model.layers.2.self_attn.k_proj.weight has shape [16, 16] but "
                        "config.json implies [8, 16] (num_key_value_heads * head_dim, "
                        "hidden_size)"));

  testing::ScopedTempDir norm;
  WriteCheckpoint(norm.path(), TinyConfig(/*tied=*/false), {"--shape", "model.norm.weight=1,16"});
  const absl::StatusOr<std::unique_ptr<ModelWeights>> n = LoadModelWeights(norm.path());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(n.status()), HasSubstr("model.norm.weight has shape [1, 16]"));
}

TEST(LoadModelWeightsTest, NonFloatDtypeIsRejected) {
  testing::ScopedTempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(/*tied=*/true),
                  {"--set", "model.embed_tokens.weight=I32"});
  const absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(w.status()),
              HasSubstr("tensor model.embed_tokens.weight has dtype I32; specd loads F32, F16 or "
                        "BF16 weights"));
}

TEST(LoadModelWeightsTest, ConfigProblemsComeFirst) {
  testing::ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir.path());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(w.status()), HasSubstr("config.json"));

  // A valid config whose checkpoint files are missing.
  testing::WriteFileBytes(dir.path() / "config.json", TinyConfig(false).dump());
  w = LoadModelWeights(dir.path());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(w.status()), HasSubstr("model.safetensors"));
}

}  // namespace
}  // namespace specd
