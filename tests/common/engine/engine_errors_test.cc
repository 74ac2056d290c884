// Bad forward requests get precise statuses and leave every sequence exactly as it was.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;

class EngineErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.num_layers = 1;
    spec.config.max_position_embeddings = 64;
    testing::WriteSynth(spec, tmp_.path());
    // 4 blocks of 16 tokens.
    engine_ = testing::MakeEngine(tmp_.path(), 1, /*kv_tokens=*/64);
    ASSERT_NE(engine_, nullptr);
    ASSERT_TRUE(engine_->AddSequence(1).ok());
    ASSERT_TRUE(engine_->AddSequence(2).ok());
    ASSERT_TRUE(Feed(1, std::vector<int32_t>(10, 5), 0).ok());
  }

  absl::Status Feed(KvPool::SeqId seq, const std::vector<int32_t>& tokens, int64_t start) {
    SequenceInput in;
    in.seq = seq;
    in.tokens = tokens;
    in.start_pos = start;
    in.logit_indices = {static_cast<int32_t>(tokens.size() - 1)};
    return engine_->Forward(std::span<const SequenceInput>(&in, 1)).status();
  }

  void ExpectUnchanged() {
    EXPECT_EQ(*engine_->kv().Length(1), 10);
    EXPECT_EQ(*engine_->kv().Length(2), 0);
    EXPECT_EQ(engine_->kv().used_blocks(), 1);
  }

  ScopedTempDir tmp_;
  std::unique_ptr<LlamaEngine> engine_;
};

TEST_F(EngineErrorsTest, WrongCachedLengthIsFailedPrecondition) {
  const absl::Status st = Feed(1, {3}, 9);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("expects 9 cached tokens, worker has 10"));
  ExpectUnchanged();
}

TEST_F(EngineErrorsTest, UnknownSequenceIsNotFound) {
  const absl::Status st = Feed(99, {3}, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("99"));
  ExpectUnchanged();
}

TEST_F(EngineErrorsTest, TokenOutOfRangeIsInvalidArgument) {
  for (const int32_t bad : {-1, 300, 1 << 30}) {
    const absl::Status st = Feed(1, {3, bad}, 10);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("outside [0, 300)"));
  }
  ExpectUnchanged();
}

TEST_F(EngineErrorsTest, OverMaxSeqLenIsOutOfRange) {
  const absl::Status st = Feed(1, std::vector<int32_t>(60, 4), 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("max_seq_len 64"));
  ExpectUnchanged();
}

TEST_F(EngineErrorsTest, FullPoolIsResourceExhaustedAndBatchIsAtomic) {
  // Sequence 2 takes 3 blocks; sequence 1 then cannot grow past its one block.
  std::vector<SequenceInput> batch(2);
  const std::vector<int32_t> many(48, 7), more(20, 7);
  batch[0].seq = 2;
  batch[0].tokens = many;
  batch[0].start_pos = 0;
  batch[1].seq = 1;
  batch[1].tokens = more;
  batch[1].start_pos = 10;
  const absl::Status st = engine_->Forward(batch).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("are free"));
  ExpectUnchanged();
  // The pool still works afterwards.
  EXPECT_TRUE(Feed(2, many, 0).ok());
}

TEST_F(EngineErrorsTest, DuplicateSequenceAndBadIndicesAreInvalidArgument) {
  std::vector<SequenceInput> batch(2);
  const std::vector<int32_t> t = {3};
  for (auto& in : batch) {
    in.seq = 1;
    in.tokens = t;
    in.start_pos = 10;
  }
  EXPECT_EQ(engine_->Forward(batch).status().code(), absl::StatusCode::kInvalidArgument);
  SequenceInput in;
  in.seq = 1;
  in.tokens = t;
  in.start_pos = 10;
  in.logit_indices = {1};
  EXPECT_EQ(engine_->Forward(std::span<const SequenceInput>(&in, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  in.logit_indices = {};
  in.tokens = {};
  EXPECT_EQ(engine_->Forward(std::span<const SequenceInput>(&in, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(EngineErrorsTest, TruncateAndReleaseReturnEveryBlock) {
  ASSERT_TRUE(Feed(2, std::vector<int32_t>(40, 8), 0).ok());
  EXPECT_EQ(engine_->kv().used_blocks(), 4);
  ASSERT_TRUE(engine_->Truncate(2, 17).ok());
  EXPECT_EQ(engine_->kv().used_blocks(), 3);
  ASSERT_TRUE(engine_->Truncate(2, 17).ok());  // idempotent
  EXPECT_EQ(engine_->kv().used_blocks(), 3);
  ASSERT_TRUE(engine_->Release(2).ok());
  ASSERT_TRUE(engine_->Release(1).ok());
  EXPECT_EQ(engine_->kv().used_blocks(), 0);
}

}  // namespace
}  // namespace specd
