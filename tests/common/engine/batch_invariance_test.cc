// A sequence's logits are bit-identical whether it feeds its tokens one at a time, K+1 at once or
// in a batch with other sequences of different lengths, and whatever the thread count. This is
// what makes greedy speculative decoding token-for-token identical to plain decoding.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 131 + salt * 17 + 3) % vocab);
  return t;
}

// Logits of every position of `tokens`, fed in chunks of the given sizes (cycled).
std::vector<float> FeedInChunks(LlamaEngine& engine, KvPool::SeqId seq,
                                const std::vector<int32_t>& tokens,
                                const std::vector<int>& chunks) {
  EXPECT_TRUE(engine.AddSequence(seq).ok());
  std::vector<float> all;
  size_t pos = 0;
  for (size_t c = 0; pos < tokens.size(); ++c) {
    const size_t n = std::min<size_t>(chunks[c % chunks.size()], tokens.size() - pos);
    SequenceInput in;
    in.seq = seq;
    in.tokens = std::span<const int32_t>(tokens).subspan(pos, n);
    in.start_pos = static_cast<int64_t>(pos);
    for (size_t i = 0; i < n; ++i) in.logit_indices.push_back(static_cast<int32_t>(i));
    const std::vector<float> logits =
        testing::ForwardLogits(engine, std::span<const SequenceInput>(&in, 1));
    if (logits.empty()) return {};
    all.insert(all.end(), logits.begin(), logits.end());
    pos += n;
  }
  EXPECT_TRUE(engine.Release(seq).ok());
  return all;
}

class BatchInvarianceTest : public ::testing::TestWithParam<kernels::DType> {
 protected:
  void SetUp() override {
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.num_layers = 2;
    spec.dtype = GetParam();
    spec.residual_scale = 0.7;
    testing::WriteSynth(spec, tmp_.path());
    vocab_ = static_cast<int>(spec.config.vocab_size);
  }
  ScopedTempDir tmp_;
  int vocab_ = 0;
};

TEST_P(BatchInvarianceTest, ChunkingAndThreadsDoNotChangeBits) {
  auto one = testing::MakeEngine(tmp_.path(), 1);
  auto two = testing::MakeEngine(tmp_.path(), 2);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  const std::vector<int32_t> tokens = Tokens(45, 1, vocab_);
  const std::vector<float> whole = FeedInChunks(*one, 1, tokens, {45});
  const std::vector<float> single = FeedInChunks(*one, 2, tokens, {1});
  const std::vector<float> verify_like = FeedInChunks(*one, 3, tokens, {5, 1, 3, 9});
  const std::vector<float> threaded = FeedInChunks(*two, 4, tokens, {7, 2});
  ASSERT_EQ(whole.size(), tokens.size() * static_cast<size_t>(vocab_));
  for (const auto* other : {&single, &verify_like, &threaded}) {
    ASSERT_EQ(other->size(), whole.size());
    EXPECT_EQ(std::memcmp(other->data(), whole.data(), whole.size() * sizeof(float)), 0);
  }
}

TEST_P(BatchInvarianceTest, OtherSequencesInTheBatchDoNotChangeBits) {
  auto engine = testing::MakeEngine(tmp_.path(), 2);
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> a = Tokens(30, 1, vocab_);
  const std::vector<float> alone = FeedInChunks(*engine, 10, a, {30});

  // Now `a` is fed 6 tokens at a time (like K = 5 verification) next to three sequences with
  // different lengths and prompt sizes, in varying batch positions.
  const std::vector<std::vector<int32_t>> others = {Tokens(50, 2, vocab_), Tokens(7, 3, vocab_),
                                                    Tokens(64, 4, vocab_)};
  for (KvPool::SeqId s = 20; s <= 23; ++s) ASSERT_TRUE(engine->AddSequence(s).ok());
  std::vector<size_t> done(4, 0);
  std::vector<float> batched;
  for (int round = 0; done[0] < a.size(); ++round) {
    std::vector<SequenceInput> batch;
    std::vector<size_t> fed(4, 0);
    for (int j = 0; j < 4; ++j) {
      const int k = (j + round) % 4;  // rotate batch order each round
      const std::vector<int32_t>& toks = k == 0 ? a : others[static_cast<size_t>(k - 1)];
      if (done[k] >= toks.size()) continue;
      const size_t n =
          std::min<size_t>(k == 0 ? 6 : 1 + (round * 7 + k) % 13, toks.size() - done[k]);
      SequenceInput in;
      in.seq = 20 + static_cast<KvPool::SeqId>(k);
      in.tokens = std::span<const int32_t>(toks).subspan(done[k], n);
      in.start_pos = static_cast<int64_t>(done[k]);
      for (size_t i = 0; i < n; ++i) in.logit_indices.push_back(static_cast<int32_t>(i));
      batch.push_back(in);
      fed[k] = n;
    }
    const std::vector<float> out = testing::ForwardLogits(*engine, batch);
    ASSERT_FALSE(out.empty());
    // Pick out a's rows.
    int64_t row = 0;
    for (const SequenceInput& in : batch) {
      if (in.seq == 20) {
        const auto begin = out.begin() + row * vocab_;
        batched.insert(batched.end(), begin,
                       begin + static_cast<int64_t>(in.tokens.size()) * vocab_);
      }
      row += static_cast<int64_t>(in.logit_indices.size());
    }
    for (int k = 0; k < 4; ++k) done[k] += fed[k];
  }
  ASSERT_EQ(batched.size(), alone.size());
  EXPECT_EQ(std::memcmp(batched.data(), alone.data(), alone.size() * sizeof(float)), 0);
}

// A back end that records passes (CUDA graphs; RecordingBackend under
// SPECD_TEST_BACKEND=cpu-recording) gives the same bits whether a pass runs eagerly, is recorded
// or is replayed: an engine recording its passes against one that never does, over decode,
// verify-sized and catch-up passes of several sequences whose shapes repeat.
TEST_P(BatchInvarianceTest, RecordedPassesGiveTheEagerBits) {
  EngineOptions options;
  options.kv_capacity_tokens = 2048;
  options.kv_block_size = 16;
  options.record_forwards = false;
  auto eager = testing::MakeTestEngine(tmp_.path(), 2, options);
  options.record_forwards = true;
  auto recorded = testing::MakeTestEngine(tmp_.path(), 2, options);
  ASSERT_NE(eager, nullptr);
  ASSERT_NE(recorded, nullptr);
  if (!recorded->backend().SupportsRecording()) {
    GTEST_SKIP() << "the " << recorded->backend().name()
                 << " back end runs every pass eagerly; SPECD_TEST_BACKEND=cpu-recording or cuda "
                    "records them";
  }
  for (int round = 0; round < 24; ++round) {
    std::vector<float> out[2];
    LlamaEngine* engines[2] = {eager.get(), recorded.get()};
    for (int e = 0; e < 2; ++e) {
      std::vector<std::vector<int32_t>> tokens;
      std::vector<SequenceInput> batch;
      for (KvPool::SeqId s = 1; s <= static_cast<KvPool::SeqId>(1 + round % 3); ++s) {
        if (!engines[e]->kv().Length(s).ok()) {
          ASSERT_TRUE(engines[e]->AddSequence(s).ok());
        }
        const int n = 1 + (round * 3 + static_cast<int>(s)) % 5;
        tokens.push_back(Tokens(n, round + static_cast<int>(s), vocab_));
      }
      for (size_t i = 0; i < tokens.size(); ++i) {
        SequenceInput in;
        in.seq = static_cast<KvPool::SeqId>(i + 1);
        in.tokens = tokens[i];
        in.start_pos = *engines[e]->kv().Length(in.seq);
        for (size_t j = 0; j < tokens[i].size(); ++j)
          in.logit_indices.push_back(static_cast<int32_t>(j));
        batch.push_back(in);
      }
      out[e] = testing::ForwardLogits(*engines[e], batch);
    }
    ASSERT_FALSE(out[0].empty());
    ASSERT_EQ(out[0].size(), out[1].size());
    EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0)
        << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BatchInvarianceTest,
                         ::testing::Values(kernels::DType::kF32, kernels::DType::kBF16,
                                           kernels::DType::kF16),
                         [](const auto& info) {
                           return std::string(kernels::DTypeName(info.param));
                         });

}  // namespace
}  // namespace specd
