// Recorded forward passes (CUDA graphs on a GPU), on a back end that records as CUDA does but
// computes on the CPU (RecordingBackend), against the same engine on the plain CPU back end:
//  * every pass gives the plain engine's bits, whether it ran eagerly, was recorded or was
//    replayed, and whatever padding its shape bucket added (pad tokens, sequences, logit rows);
//  * passes whose shapes fall in one bucket share one recording, and a growing sequence's
//    passes are recorded again only when its block table outgrows the width uploaded;
//  * beyond kMaxRecordedShapes the least recently replayed recording goes, and comes back when
//    its shape does.
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/engine/recording_backend.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::RecordingBackend;
using testing::ScopedTempDir;

static_assert(RecordedBucket(0) == 0 && RecordedBucket(1) == 1 && RecordedBucket(8) == 8);
static_assert(RecordedBucket(9) == 16 && RecordedBucket(64) == 64 && RecordedBucket(65) == 80);
static_assert(RecordedBucket(129) == 160 && RecordedBucket(256) == 256);

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 131 + salt * 17 + 3) % vocab);
  return t;
}

class RecordingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.num_layers = 2;
    spec.config.max_position_embeddings = 512;  // room for a pass over kMaxRecordedTokens
    spec.residual_scale = 0.7;
    testing::WriteSynth(spec, tmp_.path());
    vocab_ = static_cast<int>(spec.config.vocab_size);
    EngineOptions options;
    options.kv_capacity_tokens = 4096;
    plain_ = testing::MakeEngine(tmp_.path(), 2, options.kv_capacity_tokens);
    absl::StatusOr<std::unique_ptr<LlamaEngine>> recording =
        testing::CreateRecordingEngine(tmp_.path(), 2, options);
    ASSERT_TRUE(recording.ok()) << recording.status();
    recording_ = *std::move(recording);
    ASSERT_NE(plain_, nullptr);
    backend_ = dynamic_cast<RecordingBackend*>(&recording_->backend());
    ASSERT_NE(backend_, nullptr);
  }

  // One pass of `feeds` (sequence, tokens, logit rows: the last `logits` tokens) on both
  // engines, appending to what each sequence holds; expects the same logits bit for bit.
  struct Feed {
    KvPool::SeqId seq;
    int tokens;
    int logits;
  };
  void Pass(const std::vector<Feed>& feeds, int salt) {
    std::vector<std::vector<int32_t>> tokens;
    for (const Feed& f : feeds)
      tokens.push_back(Tokens(f.tokens, salt + static_cast<int>(f.seq), vocab_));
    std::vector<float> out[2];
    LlamaEngine* engines[2] = {plain_.get(), recording_.get()};
    for (int e = 0; e < 2; ++e) {
      std::vector<SequenceInput> batch;
      for (size_t i = 0; i < feeds.size(); ++i) {
        const Feed& f = feeds[i];
        if (!engines[e]->kv().Length(f.seq).ok()) {
          ASSERT_TRUE(engines[e]->AddSequence(f.seq).ok());
        }
        SequenceInput in;
        in.seq = f.seq;
        in.tokens = tokens[i];
        in.start_pos = *engines[e]->kv().Length(f.seq);
        for (int j = f.tokens - f.logits; j < f.tokens; ++j) in.logit_indices.push_back(j);
        batch.push_back(in);
      }
      out[e] = testing::ForwardLogits(*engines[e], batch);
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0)
        << "a recorded engine's logits differ from the plain engine's";
  }
  void Reset(KvPool::SeqId seq) {
    for (LlamaEngine* e : {plain_.get(), recording_.get()}) ASSERT_TRUE(e->Truncate(seq, 0).ok());
  }

  ScopedTempDir tmp_;
  int vocab_ = 0;
  std::unique_ptr<LlamaEngine> plain_;
  std::unique_ptr<LlamaEngine> recording_;
  RecordingBackend* backend_ = nullptr;
};

TEST_F(RecordingTest, EagerRecordedAndReplayedPassesGiveThePlainBits) {
  // Several sequences decoding, verifying K + 1 = 5 tokens and catching up 1..5 tokens, in
  // every order, so that shapes repeat (recorded, then replayed) and most are padded.
  for (int round = 0; round < 24; ++round) {
    std::vector<Feed> feeds;
    for (KvPool::SeqId s = 1; s <= static_cast<KvPool::SeqId>(1 + round % 4); ++s) {
      const int n = 1 + (round * 3 + static_cast<int>(s)) % 5;
      feeds.push_back({s, n, round % 2 == 0 ? n : 1});
    }
    Pass(feeds, round);
  }
  // A pass with no logits (a prefill chunk), and one of more tokens than are ever recorded.
  Pass({{9, 40, 0}}, 1);
  Pass({{9, 40, 0}}, 2);
  Pass({{9, 40, 1}}, 3);
  Pass({{10, static_cast<int>(kMaxRecordedTokens) + 1, 2}}, 4);
  EXPECT_GT(backend_->recordings(), 0);
  EXPECT_GT(backend_->replays(), backend_->recordings());
}

TEST_F(RecordingTest, ShapesInOneBucketShareOneRecording) {
  // 9..16 tokens with one logit row: bucket (16 tokens, 2 sequences with the pad's, 1 row).
  for (int n = 9; n <= 16; ++n) {
    Pass({{1, n, 1}}, n);
    Reset(1);
  }
  EXPECT_EQ(backend_->recordings(), 1);
  EXPECT_EQ(backend_->replays(), 7);  // the first pass ran eagerly, the second recorded
}

TEST_F(RecordingTest, AGrowingSequenceIsRecordedOncePerTableWidth) {
  // A pass uploads block tables only as wide as its longest sequence's, rounded up to a power of
  // two (at least 8 blocks of 16 tokens): decoding from 100 to 160 tokens crosses from 8 blocks
  // to 9, so the decode shape is recorded at width 8 and again at width 16, and every pass,
  // either side, gives the plain engine's bits.
  Pass({{1, 100, 1}}, 0);  // seen once: runs eagerly, never recorded
  for (int step = 0; step < 60; ++step) Pass({{1, 1, 1}}, step + 1);
  EXPECT_EQ(backend_->recordings(), 2);
  // Each width: its first pass eager, then recorded and replayed, then replays.
  EXPECT_EQ(backend_->replays(), (28 - 1) + (32 - 1));
}

TEST_F(RecordingTest, TheLeastRecentlyReplayedRecordingGoesAndComesBack) {
  // Distinct buckets: T tokens with L logit rows, L over every bucket up to T.
  std::vector<Feed> shapes;
  for (int t = 8; t <= 40; t += 8) {
    for (int l = 1; l <= t; ++l) {
      if (RecordedBucket(l) == l) shapes.push_back({1, t, l});
    }
  }
  ASSERT_GT(shapes.size(), kMaxRecordedShapes);
  for (const Feed& f : shapes) {
    for (int seen = 0; seen < 2; ++seen) {
      Pass({f}, seen);
      Reset(1);
    }
  }
  const int64_t all = static_cast<int64_t>(shapes.size());
  ASSERT_EQ(backend_->recordings(), all);
  // The last shape is kept: replayed.
  Pass({shapes.back()}, 5);
  Reset(1);
  EXPECT_EQ(backend_->recordings(), all);
  // The first went when the map was full: recorded again, and right.
  Pass({shapes.front()}, 6);
  Reset(1);
  EXPECT_EQ(backend_->recordings(), all + 1);
}

}  // namespace
}  // namespace specd
