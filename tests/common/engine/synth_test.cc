// Synthetic checkpoints: an early-exit draft written to disk equals running the target with
// --exit-layer, and the residual scale controls how often it agrees with the target.
#include <cstring>
#include <vector>

#include "common/engine/decode_loop.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

TEST(SynthTest, EarlyExitDraftEqualsExitLayerLoading) {
  ScopedTempDir target, draft;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  spec.config.num_layers = 4;
  spec.dtype = kernels::DType::kBF16;
  testing::WriteSynth(spec, target.path());
  ASSERT_TRUE(WriteEarlyExitDraft(target.path(), 2, draft.path()).ok());

  auto from_dir = testing::MakeEngine(draft.path(), 2);
  auto from_flag = testing::MakeEngine(target.path(), 2, 2048, /*exit_layer=*/2);
  ASSERT_NE(from_dir, nullptr);
  ASSERT_NE(from_flag, nullptr);
  EXPECT_EQ(from_dir->config().num_layers, 2);
  const std::vector<int32_t> tokens = {1, 50, 60, 70, 80, 90, 100};
  const std::vector<float> a = testing::PrefillAll(*from_dir, 1, tokens);
  const std::vector<float> b = testing::PrefillAll(*from_flag, 1, tokens);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(SynthTest, EarlyExitDraftRejectsBadLayerCounts) {
  ScopedTempDir target, draft;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  testing::WriteSynth(spec, target.path());
  EXPECT_EQ(WriteEarlyExitDraft(target.path(), 0, draft.path()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteEarlyExitDraft(target.path(), 4, draft.path()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Greedy agreement of a 1-layer early exit with its 4-layer target, teacher-forced on the
// target's own greedy continuation.
double Agreement(double residual_scale) {
  ScopedTempDir dir;
  SynthSpec spec;
  spec.config = testing::SmallConfig();
  spec.config.num_layers = 4;
  spec.residual_scale = residual_scale;
  spec.seed = 3;
  testing::WriteSynth(spec, dir.path());
  auto target = testing::MakeEngine(dir.path(), 2);
  auto draft = testing::MakeEngine(dir.path(), 2, 2048, 1);
  int agree = 0, total = 0;
  for (int p = 0; p < 8; ++p) {
    DecodeRequest req;
    req.prompt = {1, 10 + p * 13, 20 + p * 7};
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = 24;
    absl::StatusOr<DecodeResult> out = DecodePlain(*target, 1, req);
    EXPECT_TRUE(out.ok());
    std::vector<int32_t> seq = req.prompt;
    seq.insert(seq.end(), out->tokens.begin(), out->tokens.end());
    const std::vector<float> logits = testing::PrefillAll(*draft, 2, seq);
    EXPECT_TRUE(draft->Release(2).ok());
    const size_t V = static_cast<size_t>(draft->config().vocab_size);
    for (size_t j = req.prompt.size(); j < seq.size(); ++j) {
      const float* row = logits.data() + (j - 1) * V;
      agree += static_cast<int32_t>(std::max_element(row, row + V) - row) == seq[j];
      ++total;
    }
  }
  return static_cast<double>(agree) / total;
}

TEST(SynthTest, ResidualScaleControlsAgreement) {
  const double high = Agreement(0.02);
  const double mid = Agreement(0.3);
  const double low = Agreement(2.0);
  std::printf("greedy agreement: s=0.02 %.2f, s=0.3 %.2f, s=2.0 %.2f\n", high, mid, low);
  EXPECT_GT(high, 0.8);
  EXPECT_GT(high, mid);
  EXPECT_GT(mid, low);
}

}  // namespace
}  // namespace specd
