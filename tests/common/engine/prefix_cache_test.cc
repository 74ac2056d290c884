// Prefix caching in the engine: a sequence that reuses cached KV blocks (whole, or a partially
// used last block copied on write) gets logits bit-identical (memcmp) to a fresh engine without a
// cache that computes the whole prompt, for every KV dtype: batch invariance makes the cached KV
// exactly the recomputed one. And the cache is keyed by the model and the KV dtype.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;
using Tokens = std::vector<int32_t>;

constexpr int64_t kBlock = 16;

// On testing::TestBackend: both engines of a comparison run on it, so it compares a back end
// with itself.
std::unique_ptr<LlamaEngine> MakeEngine(const std::filesystem::path& dir, kernels::DType kv,
                                        bool prefix_caching, int threads = 2) {
  EngineOptions options;
  options.kv_capacity_tokens = 1024;
  options.kv_block_size = kBlock;
  options.kv_dtype = kv;
  options.prefix_caching = prefix_caching;
  return testing::MakeTestEngine(dir, threads, options);
}

Tokens Prompt(int n, int salt) {
  Tokens t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 53 + salt * 29) % 290);
  return t;
}

// Feeds tokens[from:] to `seq` (holding tokens[:from]) with logits at every fed position.
std::vector<float> FeedRest(LlamaEngine& engine, KvPool::SeqId seq, const Tokens& tokens,
                            int64_t from) {
  SequenceInput in;
  in.seq = seq;
  in.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(from));
  in.start_pos = from;
  for (size_t i = 0; i < in.tokens.size(); ++i) in.logit_indices.push_back(static_cast<int32_t>(i));
  return testing::ForwardLogits(engine, std::span<const SequenceInput>(&in, 1));
}

// The logit rows of positions [from, end) out of a whole-prompt prefill.
std::vector<float> Rows(const std::vector<float>& all, int64_t vocab, int64_t from) {
  return std::vector<float>(all.begin() + from * vocab, all.end());
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class PrefixCacheEngineTest : public ::testing::TestWithParam<kernels::DType> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.residual_scale = 0.7;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static inline ScopedTempDir* dir_ = nullptr;
};

TEST_P(PrefixCacheEngineTest, CachedKvGivesTheLogitsOfARecomputedPrompt) {
  auto cached = MakeEngine(dir_->path(), GetParam(), true);
  ASSERT_NE(cached, nullptr);
  const int64_t vocab = cached->config().vocab_size;
  const Tokens system = Prompt(40, 1);
  const std::vector<float> first = testing::PrefillAll(*cached, 1, system);
  ASSERT_TRUE(cached->CacheCommitted(1, 40).ok());
  EXPECT_EQ(cached->kv().cached_blocks(), 2);

  struct Case {
    const char* name;
    Tokens prompt;
    int64_t want_hit;
  };
  Tokens other = Tokens(system.begin(), system.begin() + 37);
  const Tokens tail = Prompt(10, 2);
  other.insert(other.end(), tail.begin(), tail.end());
  const std::vector<Case> cases = {
      // Two whole blocks reused, 15 tokens fed.
      {"shared prefix, another tail", other, 32},
      // The prompt is exactly the two cached blocks: 31 tokens attached, the last token fed
      // again into a copy of the second block.
      {"full hit", Tokens(system.begin(), system.begin() + 32), 31},
      // Shorter than a block: nothing to reuse.
      {"short", Tokens(system.begin(), system.begin() + 9), 0},
  };
  KvPool::SeqId seq = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ++seq;
    ASSERT_TRUE(cached->AddSequence(seq).ok());
    absl::StatusOr<int64_t> hit =
        cached->AttachCached(seq, c.prompt, static_cast<int64_t>(c.prompt.size()) - 1);
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(*hit, c.want_hit);
    const std::vector<float> got = FeedRest(*cached, seq, c.prompt, *hit);

    auto fresh = MakeEngine(dir_->path(), GetParam(), false, /*threads=*/1);
    const std::vector<float> want = Rows(testing::PrefillAll(*fresh, 1, c.prompt), vocab, *hit);
    EXPECT_TRUE(SameBytes(got, want)) << "logits differ from a recomputed prompt";

    // And decoding on from there: the copied block and the shared ones keep giving the same.
    Tokens longer = c.prompt;
    for (int step = 0; step < 20; ++step) {
      longer.push_back(static_cast<int32_t>(5 + step * 7));
      const std::vector<float> next =
          FeedRest(*cached, seq, longer, static_cast<int64_t>(longer.size()) - 1);
      const std::vector<float> ref =
          FeedRest(*fresh, 1, longer, static_cast<int64_t>(longer.size()) - 1);
      ASSERT_TRUE(SameBytes(next, ref)) << "decode step " << step;
    }
  }
  // The first sequence's own blocks never changed: its logits are what they were.
  ASSERT_TRUE(cached->Release(1).ok());
  ASSERT_TRUE(cached->AddSequence(2).ok());
  EXPECT_EQ(*cached->AttachCached(2, system, 39), 32);
  EXPECT_TRUE(SameBytes(FeedRest(*cached, 2, system, 32), Rows(first, vocab, 32)));
}

TEST_P(PrefixCacheEngineTest, TheCacheIsKeyedByModelAndKvDtype) {
  auto a = MakeEngine(dir_->path(), GetParam(), true);
  auto b = MakeEngine(dir_->path(), GetParam(), true);
  EXPECT_EQ(a->kv().cache_salt(), b->kv().cache_salt());
  for (const kernels::DType other :
       {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kF16}) {
    if (other == GetParam()) continue;
    EXPECT_NE(MakeEngine(dir_->path(), other, true)->kv().cache_salt(), a->kv().cache_salt());
  }
  // An early-exit draft of the same checkpoint is another model.
  EngineOptions options;
  options.kv_dtype = GetParam();
  options.kv_capacity_tokens = 1024;
  LoadOptions load;
  load.exit_layer = 1;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> draft =
      CreateCpuEngine(dir_->path(), 1, options, load);
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_NE((*draft)->kv().cache_salt(), a->kv().cache_salt());
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, PrefixCacheEngineTest,
                         ::testing::Values(kernels::DType::kF32, kernels::DType::kBF16,
                                           kernels::DType::kF16),
                         [](const ::testing::TestParamInfo<kernels::DType>& info) {
                           return std::string(kernels::DTypeName(info.param));
                         });

}  // namespace
}  // namespace specd
