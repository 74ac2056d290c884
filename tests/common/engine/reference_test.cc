// The engine's logits against an independent numpy forward pass (tests/reference/llama_ref.py),
// over synthetic checkpoints that cover GQA, tied/untied embeddings, llama3 RoPE scaling, explicit
// head_dim, sharded files and f32/f16/bf16 weights.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

struct RefCase {
  std::string name;
  kernels::DType dtype;
  bool tied;
  bool llama3_rope;
  int64_t head_dim_override;  // 0 = hidden / heads
  int num_shards;
  int threads;
};

std::string PrintCase(const ::testing::TestParamInfo<RefCase>& info) { return info.param.name; }

std::vector<float> RunReference(const std::filesystem::path& dir,
                                const std::vector<int32_t>& tokens, int64_t vocab) {
  const std::filesystem::path out = dir / "ref_logits.f32";
  const std::string cmd = absl::StrCat(
      testing::Python(), " ", (testing::SourceDir() / "tests/reference/llama_ref.py").string(), " ",
      dir.string(), " ", out.string(), " ", absl::StrJoin(tokens, " "));
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "reference failed: " << cmd;
  std::vector<float> logits(tokens.size() * static_cast<size_t>(vocab));
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(logits.data()),
         static_cast<std::streamsize>(logits.size() * sizeof(float)));
  EXPECT_TRUE(f.good()) << "short reference output " << out;
  return logits;
}

class ReferenceTest : public ::testing::TestWithParam<RefCase> {};

TEST_P(ReferenceTest, LogitsMatchNumpyWithin1e4Relative) {
  const RefCase& rc = GetParam();
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  spec.config.tie_word_embeddings = rc.tied;
  if (rc.head_dim_override > 0) spec.config.head_dim = rc.head_dim_override;
  if (rc.llama3_rope) {
    spec.config.rope_theta = 500000.0;
    // A short original context so that low-, medium- and high-frequency bands all occur.
    spec.config.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 64};
  }
  spec.dtype = rc.dtype;
  spec.seed = 7;
  spec.residual_scale = 0.5;
  spec.num_shards = rc.num_shards;
  testing::WriteSynth(spec, tmp.path());

  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i)
    tokens.push_back((i * 37 + 11) % static_cast<int>(spec.config.vocab_size));
  auto engine = testing::MakeEngine(tmp.path(), rc.threads);
  ASSERT_NE(engine, nullptr);
  const std::vector<float> ours = testing::PrefillAll(*engine, 1, tokens);
  const std::vector<float> ref = RunReference(tmp.path(), tokens, spec.config.vocab_size);
  ASSERT_EQ(ours.size(), ref.size());

  // Relative to the largest reference logit of the row: an elementwise relative error is
  // meaningless for logits near zero.
  const size_t V = static_cast<size_t>(spec.config.vocab_size);
  double worst = 0.0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    double scale = 0.0;
    for (size_t v = 0; v < V; ++v) scale = std::max(scale, std::fabs(double{ref[t * V + v]}));
    for (size_t v = 0; v < V; ++v) {
      const double err = std::fabs(double{ours[t * V + v]} - double{ref[t * V + v]}) / scale;
      ASSERT_FALSE(std::isnan(ours[t * V + v]));
      worst = std::max(worst, err);
      ASSERT_LE(err, 1e-4) << "position " << t << " token " << v << ": ours " << ours[t * V + v]
                           << " reference " << ref[t * V + v];
    }
  }
  std::printf("[%s] worst relative error %.3g\n", rc.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, ReferenceTest,
    ::testing::Values(
        RefCase{"f32_untied", kernels::DType::kF32, false, false, 0, 1, 1},
        RefCase{"f32_tied_2threads", kernels::DType::kF32, true, false, 0, 1, 2},
        RefCase{"bf16_untied", kernels::DType::kBF16, false, false, 0, 1, 2},
        RefCase{"f16_tied", kernels::DType::kF16, true, false, 0, 1, 1},
        RefCase{"f32_llama3_rope", kernels::DType::kF32, false, true, 0, 1, 2},
        RefCase{"bf16_llama3_rope_sharded", kernels::DType::kBF16, true, true, 0, 3, 2},
        RefCase{"f32_explicit_head_dim", kernels::DType::kF32, false, false, 16, 1, 2}),
    PrintCase);

}  // namespace
}  // namespace specd
