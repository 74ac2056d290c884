// Sizing the KV cache from a share of GPU memory (EngineOptions::gpu_memory_fraction): two
// workers sharing a device with each other as peer get pools of the same token count, which fill
// the share; too small a share is RESOURCE_EXHAUSTED naming the bytes. On the CPU back end the
// fraction is ignored and kv_capacity_tokens rules.
#include <filesystem>

#include "common/engine/llama_engine.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

ModelConfig Llama3b() { return *ShapePreset("llama-3.2-3b"); }
ModelConfig Llama1b() { return *ShapePreset("llama-3.2-1b"); }

TEST(MemoryShareTest, EstimateCountsEveryWeightAndTheKvOfEveryLayer) {
  ModelConfig c = Llama3b();
  c.torch_dtype = kernels::DType::kBF16;
  c.tie_word_embeddings = false;
  const ModelMemory m = EstimateModelMemory(c, kernels::DType::kBF16, kDefaultMaxPassTokens);
  // 3.61e9 parameters with an untied classifier (Llama-3.2-3B's 3.21B plus the 394M of an
  // untied head), two bytes each, plus f32 norm weights.
  const int64_t params = int64_t{128256} * 3072 * 2 +
                         int64_t{28} * (2 * 3072 * 3072 + 2 * 1024 * 3072 + 3 * 8192 * 3072);
  EXPECT_EQ(m.weights_bytes, params * 2 + (2 * 28 + 2) * 3072 * 4);
  EXPECT_EQ(m.kv_bytes_per_token, 2 * 28 * 1024 * 2);
  EXPECT_GT(m.scratch_reserve_bytes, 0);
}

TEST(MemoryShareTest, PeersGetTheSameTokenCountAndFillTheirShare) {
  ModelConfig target = Llama3b(), draft = Llama1b();
  target.torch_dtype = draft.torch_dtype = kernels::DType::kBF16;
  const ModelMemory t = EstimateModelMemory(target, kernels::DType::kBF16, kDefaultMaxPassTokens);
  const ModelMemory d = EstimateModelMemory(draft, kernels::DType::kBF16, kDefaultMaxPassTokens);
  const int64_t total = int64_t{80} << 30;
  const absl::StatusOr<int64_t> nt = KvTokensForShare(
      t, 0.9, total, d.weights_bytes + d.scratch_reserve_bytes, d.kv_bytes_per_token);
  const absl::StatusOr<int64_t> nd = KvTokensForShare(
      d, 0.9, total, t.weights_bytes + t.scratch_reserve_bytes, t.kv_bytes_per_token);
  ASSERT_TRUE(nt.ok()) << nt.status();
  ASSERT_TRUE(nd.ok()) << nd.status();
  EXPECT_EQ(*nt, *nd);
  const int64_t used = t.weights_bytes + t.scratch_reserve_bytes + d.weights_bytes +
                       d.scratch_reserve_bytes +
                       *nt * (t.kv_bytes_per_token + d.kv_bytes_per_token);
  const int64_t share = static_cast<int64_t>(0.9 * static_cast<double>(total));
  EXPECT_LE(used, share);
  EXPECT_GT(used, share - (t.kv_bytes_per_token + d.kv_bytes_per_token));
  // Alone, a worker takes its whole share for itself.
  const absl::StatusOr<int64_t> alone = KvTokensForShare(t, 0.45, total, 0, 0);
  ASSERT_TRUE(alone.ok());
  EXPECT_GT(*alone, 0);
}

TEST(MemoryShareTest, TooSmallAShareNamesTheBytes) {
  ModelConfig c = Llama3b();
  c.torch_dtype = kernels::DType::kBF16;
  const absl::StatusOr<int64_t> n =
      KvTokensForShare(EstimateModelMemory(c, kernels::DType::kBF16, kDefaultMaxPassTokens), 0.05,
                       int64_t{80} << 30, 0, 0);
  ASSERT_EQ(n.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(n.status().message()).find("GiB"), std::string::npos);
}

TEST(MemoryShareTest, TheCpuBackEndIgnoresTheFraction) {
  testing::ScopedTempDir dir;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  testing::WriteSynth(spec, dir.path());
  EngineOptions options;
  options.kv_capacity_tokens = 320;
  options.kv_block_size = 16;
  options.gpu_memory_fraction = 0.5;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(dir.path(), 1, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->kv().total_blocks(), 20);
}

}  // namespace
}  // namespace specd
