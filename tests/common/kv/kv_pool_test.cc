// The KV pool's bookkeeping without prefix caching (block tables against a model of lengths) and
// with it (prefix_cache_test.cc has the model-checked randomized test).
#include "common/kv/kv_pool.h"

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<KvPool> MakePool(int64_t num_blocks, int64_t block_size,
                                 int64_t max_blocks_per_seq) {
  absl::StatusOr<std::unique_ptr<KvPool>> pool =
      KvPool::Create({num_blocks, block_size, max_blocks_per_seq});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Appends n arbitrary tokens.
absl::Status Grow(KvPool& pool, KvPool::SeqId seq, int64_t n) {
  const std::vector<int32_t> tokens(static_cast<size_t>(n), 7);
  return pool.Append(seq, tokens);
}

// The expected state, kept independently of the pool: only lengths. Everything else (blocks per
// sequence, free count) follows from them and the config.
class Model {
 public:
  Model(int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        max_len_(max_blocks_per_seq * block_size) {}

  int64_t BlocksFor(int64_t len) const { return CeilDiv(len, block_size_); }
  int64_t UsedBlocks() const {
    int64_t used = 0;
    for (const auto& [seq, len] : lengths_) used += BlocksFor(len);
    return used;
  }
  int64_t FreeBlocks() const { return num_blocks_ - UsedBlocks(); }

  absl::StatusCode Add(KvPool::SeqId seq) {
    if (lengths_.contains(seq)) return absl::StatusCode::kAlreadyExists;
    lengths_[seq] = 0;
    return absl::StatusCode::kOk;
  }
  absl::StatusCode Append(KvPool::SeqId seq, int64_t n) {
    const auto it = lengths_.find(seq);
    if (it == lengths_.end()) return absl::StatusCode::kNotFound;
    const int64_t new_len = it->second + n;
    if (new_len > max_len_) return absl::StatusCode::kOutOfRange;
    if (BlocksFor(new_len) - BlocksFor(it->second) > FreeBlocks()) {
      return absl::StatusCode::kResourceExhausted;
    }
    it->second = new_len;
    return absl::StatusCode::kOk;
  }
  absl::StatusCode Truncate(KvPool::SeqId seq, int64_t new_len) {
    const auto it = lengths_.find(seq);
    if (it == lengths_.end()) return absl::StatusCode::kNotFound;
    if (new_len < 0) return absl::StatusCode::kInvalidArgument;
    it->second = std::min(it->second, new_len);
    return absl::StatusCode::kOk;
  }
  absl::StatusCode Release(KvPool::SeqId seq) {
    return lengths_.erase(seq) == 1 ? absl::StatusCode::kOk : absl::StatusCode::kNotFound;
  }

  const std::map<KvPool::SeqId, int64_t>& lengths() const { return lengths_; }

 private:
  int64_t num_blocks_;
  int64_t block_size_;
  int64_t max_len_;
  std::map<KvPool::SeqId, int64_t> lengths_;
};

// Every invariant the coordinator and the engine rely on.
void ExpectMatches(const KvPool& pool, const Model& model, KvPool::SeqId max_seq_id) {
  ASSERT_EQ(pool.num_sequences(), static_cast<int64_t>(model.lengths().size()));
  ASSERT_EQ(pool.free_blocks() + pool.used_blocks(), pool.total_blocks());
  ASSERT_EQ(pool.used_blocks(), model.UsedBlocks());
  std::set<int32_t> owned;
  for (const auto& [seq, len] : model.lengths()) {
    ASSERT_TRUE(pool.Has(seq));
    const absl::StatusOr<int64_t> got_len = pool.Length(seq);
    ASSERT_TRUE(got_len.ok());
    ASSERT_EQ(*got_len, len) << "seq " << seq;
    const absl::StatusOr<const std::vector<int32_t>*> table = pool.BlockTable(seq);
    ASSERT_TRUE(table.ok());
    ASSERT_EQ(static_cast<int64_t>((*table)->size()), model.BlocksFor(len)) << "seq " << seq;
    for (const int32_t block : **table) {
      ASSERT_GE(block, 0);
      ASSERT_LT(block, pool.total_blocks());
      ASSERT_TRUE(owned.insert(block).second) << "block " << block << " owned twice";
      ASSERT_EQ(pool.RefCount(block), 1);
    }
  }
  for (KvPool::SeqId seq = 0; seq <= max_seq_id; ++seq) {
    if (!model.lengths().contains(seq)) {
      ASSERT_FALSE(pool.Has(seq));
      ASSERT_EQ(pool.Length(seq).status().code(), absl::StatusCode::kNotFound);
    }
  }
}

struct PoolShape {
  int64_t num_blocks;
  int64_t block_size;
  int64_t max_blocks_per_seq;
};

TEST(KvPoolTest, RandomOperationsMatchAnIndependentModel) {
  constexpr PoolShape kShapes[] = {{1, 1, 1}, {8, 4, 3}, {64, 16, 16}, {37, 5, 100}, {200, 1, 50}};
  constexpr KvPool::SeqId kMaxSeqId = 11;
  for (const PoolShape& shape : kShapes) {
    for (uint32_t seed = 0; seed < 40; ++seed) {
      SCOPED_TRACE(::testing::Message() << "blocks=" << shape.num_blocks
                                        << " block_size=" << shape.block_size << " seed=" << seed);
      std::mt19937 rng(seed);
      const std::unique_ptr<KvPool> pool =
          MakePool(shape.num_blocks, shape.block_size, shape.max_blocks_per_seq);
      ASSERT_NE(pool, nullptr);
      Model model(shape.num_blocks, shape.block_size, shape.max_blocks_per_seq);
      const int64_t max_len = shape.max_blocks_per_seq * shape.block_size;
      std::uniform_int_distribution<KvPool::SeqId> pick_seq(0, kMaxSeqId);
      std::uniform_int_distribution<int> pick_op(0, 9);
      for (int step = 0; step < 400; ++step) {
        const KvPool::SeqId seq = pick_seq(rng);
        const int64_t current = model.lengths().contains(seq) ? model.lengths().at(seq) : 0;
        const int op = pick_op(rng);
        absl::StatusCode want;
        absl::Status got;
        if (op <= 1) {
          want = model.Add(seq);
          got = pool->AddSequence(seq);
        } else if (op <= 5) {
          // Mostly small appends (decode, a speculation round), sometimes a long prefill or past
          // the per-sequence limit.
          int64_t n = std::uniform_int_distribution<int64_t>(0, 3 * shape.block_size)(rng);
          if (op == 5) n = std::uniform_int_distribution<int64_t>(0, max_len + 3)(rng);
          const absl::StatusOr<int64_t> needed = pool->BlocksNeeded(seq, n);
          if (model.lengths().contains(seq)) {
            ASSERT_TRUE(needed.ok());
            ASSERT_EQ(*needed, model.BlocksFor(current + n) - model.BlocksFor(current));
          } else {
            ASSERT_EQ(needed.status().code(), absl::StatusCode::kNotFound);
          }
          want = model.Append(seq, n);
          got = Grow(*pool, seq, n);
          // Without prefix caching nothing is shared, so nothing is ever copied.
          ASSERT_TRUE(pool->PendingCopies().empty());
        } else if (op <= 8) {
          // Rejected drafts: back by up to a few blocks; sometimes a no-op or a bad length.
          std::uniform_int_distribution<int64_t> back(-1, 2 * shape.block_size);
          const int64_t new_len = current - back(rng);
          want = model.Truncate(seq, new_len);
          got = pool->Truncate(seq, new_len);
        } else {
          want = model.Release(seq);
          got = pool->Release(seq);
        }
        ASSERT_EQ(got.code(), want) << "step " << step << " op " << op << ": " << got;
        ExpectMatches(*pool, model, kMaxSeqId);
      }
      // Release everything: every block must come back.
      std::vector<KvPool::SeqId> live;
      for (const auto& [seq, len] : model.lengths()) live.push_back(seq);
      for (const KvPool::SeqId seq : live) {
        ASSERT_TRUE(pool->Release(seq).ok());
        model.Release(seq);
      }
      ExpectMatches(*pool, model, kMaxSeqId);
      EXPECT_EQ(pool->num_sequences(), 0);
      EXPECT_EQ(pool->free_blocks(), shape.num_blocks);
      EXPECT_EQ(pool->cached_blocks(), 0);
      // And all of them are usable again: one sequence can take up to its limit.
      const int64_t reachable = std::min(shape.num_blocks, shape.max_blocks_per_seq);
      ASSERT_TRUE(pool->AddSequence(0).ok());
      ASSERT_TRUE(Grow(*pool, 0, reachable * shape.block_size).ok());
      EXPECT_EQ(pool->free_blocks(), shape.num_blocks - reachable);
    }
  }
}

TEST(KvPoolTest, BlocksFreedToTheListAreReusedAndTablesStayDisjoint) {
  const std::unique_ptr<KvPool> pool = MakePool(6, 4, 6);
  ASSERT_TRUE(pool->AddSequence(1).ok());
  ASSERT_TRUE(pool->AddSequence(2).ok());
  ASSERT_TRUE(Grow(*pool, 1, 12).ok());  // 3 blocks
  ASSERT_TRUE(Grow(*pool, 2, 9).ok());   // 3 blocks
  EXPECT_EQ(pool->free_blocks(), 0);
  ASSERT_TRUE(pool->Truncate(1, 5).ok());  // keeps ceil(5/4) = 2 blocks
  EXPECT_EQ(pool->free_blocks(), 1);
  EXPECT_EQ((*pool->BlockTable(1))->size(), 2u);
  ASSERT_TRUE(Grow(*pool, 2, 4).ok());  // takes the freed block
  EXPECT_EQ(pool->free_blocks(), 0);
  std::set<int32_t> all;
  for (const KvPool::SeqId seq : {1, 2}) {
    for (const int32_t b : **pool->BlockTable(seq)) EXPECT_TRUE(all.insert(b).second);
  }
  EXPECT_EQ(all, (std::set<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(KvPoolTest, ErrorsLeaveThePoolUnchanged) {
  const std::unique_ptr<KvPool> pool = MakePool(5, 8, 3);
  ASSERT_TRUE(pool->AddSequence(7).ok());
  ASSERT_TRUE(Grow(*pool, 7, 8).ok());  // 1 block
  ASSERT_TRUE(pool->AddSequence(8).ok());
  ASSERT_TRUE(Grow(*pool, 8, 17).ok());  // 3 blocks
  const std::vector<int32_t> table7 = **pool->BlockTable(7);
  const std::vector<int32_t> table8 = **pool->BlockTable(8);
  const auto unchanged = [&] {
    EXPECT_EQ(pool->free_blocks(), 1);
    EXPECT_EQ(*pool->Length(7), 8);
    EXPECT_EQ(*pool->Length(8), 17);
    EXPECT_EQ(**pool->BlockTable(7), table7);
    EXPECT_EQ(**pool->BlockTable(8), table8);
    EXPECT_EQ(pool->num_sequences(), 2);
  };

  absl::Status s = pool->AddSequence(7);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("sequence 7 already exists"));
  unchanged();

  for (const absl::Status& unknown :
       {Grow(*pool, 99, 1), pool->Truncate(99, 0), pool->Release(99), pool->Length(99).status(),
        pool->BlockTable(99).status(), pool->BlocksNeeded(99, 1).status(),
        pool->AttachCached(99, {}, 0).status(), pool->CacheCommitted(99, 0), pool->Fork(99, 100)}) {
    EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(unknown.message(), HasSubstr("unknown sequence 99"));
  }
  EXPECT_EQ(pool->Fork(7, 8).code(), absl::StatusCode::kAlreadyExists);
  unchanged();

  // Over the per-sequence limit of 3 blocks * 8 tokens.
  s = Grow(*pool, 7, 17);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("limit of 24"));
  unchanged();

  // Within the limit but needs 2 more blocks while 1 is free: nothing is taken, not even the
  // one block that is available.
  s = Grow(*pool, 7, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("needs 2 more blocks"));
  EXPECT_THAT(s.message(), HasSubstr("only 1 of 5 are free"));
  unchanged();

  s = pool->Truncate(7, -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  unchanged();

  // Truncating past the end is a no-op, and Truncate is idempotent.
  EXPECT_TRUE(pool->Truncate(8, 1000).ok());
  unchanged();
  EXPECT_TRUE(pool->Truncate(8, 3).ok());
  EXPECT_TRUE(pool->Truncate(8, 3).ok());
  EXPECT_EQ(*pool->Length(8), 3);
  EXPECT_EQ(pool->free_blocks(), 3);
  // Growing within the last block needs no new block.
  EXPECT_EQ(*pool->BlocksNeeded(8, 5), 0);
  EXPECT_EQ(*pool->BlocksNeeded(8, 6), 1);
  EXPECT_EQ(*pool->BlocksNeeded(8, 0), 0);
  // Without prefix caching nothing is attached or cached.
  EXPECT_EQ(*pool->AttachCached(7, std::vector<int32_t>(16, 7), 15), 0);
  EXPECT_TRUE(pool->CacheCommitted(7, 8).ok());
  EXPECT_EQ(pool->cached_blocks(), 0);
}

TEST(KvPoolTest, CreateRejectsBadConfigs) {
  for (const KvPoolConfig& config :
       {KvPoolConfig{0, 16, 4}, KvPoolConfig{-1, 16, 4}, KvPoolConfig{8, 0, 4},
        KvPoolConfig{8, 4097, 4}, KvPoolConfig{8, 16, 0}, KvPoolConfig{int64_t{1} << 31, 16, 4},
        KvPoolConfig{8, 16, int64_t{1} << 31}}) {
    const absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(config);
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument)
        << config.num_blocks << " " << config.block_size << " " << config.max_blocks_per_seq;
  }
  EXPECT_THAT(KvPool::Create({0, 16, 4}).status().message(), HasSubstr("num_blocks"));
  EXPECT_THAT(KvPool::Create({8, 0, 4}).status().message(), HasSubstr("block_size"));
  EXPECT_THAT(KvPool::Create({8, 16, 0}).status().message(), HasSubstr("max_blocks_per_seq"));
}

TEST(KvPoolTest, HugeLengthsDoNotOverflow) {
  const std::unique_ptr<KvPool> pool = MakePool(4, 16, 4);
  ASSERT_TRUE(pool->AddSequence(1).ok());
  EXPECT_EQ(Grow(*pool, 1, 65).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(pool->Truncate(1, INT64_MAX).ok());
  EXPECT_EQ(*pool->Length(1), 0);
  EXPECT_GT(*pool->BlocksNeeded(1, INT64_MAX), 0);
  ASSERT_TRUE(Grow(*pool, 1, 3).ok());
  EXPECT_GT(*pool->BlocksNeeded(1, INT64_MAX), 0);
  EXPECT_EQ(pool->free_blocks(), 3);
}

}  // namespace
}  // namespace specd
