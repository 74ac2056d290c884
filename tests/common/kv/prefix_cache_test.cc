// Prefix caching in the KV pool: directed cases (attach, copy on write, twins, collisions, LRU
// eviction, fork, a failed pass) and a randomized model-checked run over prompts that share
// prefixes, with truncations, releases, evictions, forks and preemptions. The pool is driven the
// way the engine drives it, against a fake KV store in which every slot holds a fingerprint of
// the token prefix it was computed from: so any wrong reuse, any write into a shared block and
// any copy that was not made shows up as a slot that does not match its sequence.
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/kv_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using Tokens = std::vector<int32_t>;

std::unique_ptr<KvPool> MakePool(int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq,
                                 KvBlockHash hash = nullptr, uint64_t salt = 0) {
  KvPoolConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_blocks_per_seq = max_blocks_per_seq;
  c.prefix_caching = true;
  c.cache_salt = salt;
  c.block_hash = hash;
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(c);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// What the KV of position p holds: a function of tokens[0..p] only, as a real model's KV is.
uint64_t Fingerprint(uint64_t previous, int32_t token) {
  uint64_t x = (previous ^ static_cast<uint64_t>(token + 1)) * 0x9E3779B97F4A7C15ULL;
  return x ^ (x >> 29);
}

std::vector<uint64_t> Fingerprints(const Tokens& tokens) {
  std::vector<uint64_t> out;
  uint64_t f = 0x1234;
  for (const int32_t t : tokens) out.push_back(f = Fingerprint(f, t));
  return out;
}

// The engine's side: the cache memory. Appends write through the block table, after the copies
// the pool asks for; writing a slot of a block anything else holds is a test failure.
class FakeKv {
 public:
  explicit FakeKv(KvPool& pool)
      : pool_(pool), slots_(static_cast<size_t>(pool.total_blocks() * pool.block_size()), 0) {}

  // Appends tokens[old_len:] of `full` (the sequence's whole token list) like a forward pass;
  // with `fail`, like a pass that failed before its copies ran.
  absl::Status Append(KvPool::SeqId seq, const Tokens& full, int64_t old_len, bool fail = false) {
    const Tokens fed(full.begin() + old_len, full.end());
    const std::vector<int32_t> before = **pool_.BlockTable(seq);
    absl::Status st = pool_.Append(seq, fed);
    if (!st.ok()) {
      EXPECT_TRUE(pool_.PendingCopies().empty());
      EXPECT_EQ(**pool_.BlockTable(seq), before) << "a failed Append changed the table";
      return st;
    }
    if (fail) {
      EXPECT_TRUE(pool_.Truncate(seq, old_len).ok());
      pool_.RevertCopies();
      EXPECT_EQ(**pool_.BlockTable(seq), before) << "a failed pass left the table changed";
      return absl::OkStatus();
    }
    const int64_t bs = pool_.block_size();
    for (const KvBlockCopy& c : pool_.PendingCopies()) {
      EXPECT_TRUE(Private(c.dst)) << "copy into shared block " << c.dst;
      for (int64_t r = 0; r < c.rows; ++r) slots_[Slot(c.dst, r)] = slots_[Slot(c.src, r)];
    }
    const std::vector<uint64_t> want = Fingerprints(full);
    const std::vector<int32_t>& table = **pool_.BlockTable(seq);
    for (int64_t p = old_len; p < static_cast<int64_t>(full.size()); ++p) {
      const int32_t b = table[static_cast<size_t>(p / bs)];
      EXPECT_TRUE(Private(b)) << "write of position " << p << " into shared block " << b;
      slots_[Slot(b, p % bs)] = want[static_cast<size_t>(p)];
    }
    pool_.ConfirmCopies();
    return absl::OkStatus();
  }

  // Every position of `seq` holds the KV of its own prefix.
  void ExpectHolds(KvPool::SeqId seq, const Tokens& tokens) const {
    const std::vector<uint64_t> want = Fingerprints(tokens);
    const std::vector<int32_t>& table = **pool_.BlockTable(seq);
    const int64_t bs = pool_.block_size();
    for (size_t p = 0; p < tokens.size(); ++p) {
      ASSERT_EQ(slots_[Slot(table[p / static_cast<size_t>(bs)], static_cast<int64_t>(p) % bs)],
                want[p])
          << "sequence " << seq << " position " << p << " has KV of another prefix";
    }
  }

  uint64_t Checksum(int32_t block) const {
    uint64_t c = 0;
    for (int64_t r = 0; r < pool_.block_size(); ++r)
      c = Fingerprint(c, static_cast<int32_t>(slots_[Slot(block, r)]));
    return c;
  }

 private:
  bool Private(int32_t block) const { return pool_.RefCount(block) == 1 && !pool_.IsCached(block); }
  size_t Slot(int32_t block, int64_t row) const {
    return static_cast<size_t>(block * pool_.block_size() + row);
  }

  KvPool& pool_;
  std::vector<uint64_t> slots_;
};

Tokens Range(int32_t from, int n) {
  Tokens t;
  for (int i = 0; i < n; ++i) t.push_back(from + i);
  return t;
}

Tokens Concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(PrefixCacheTest, LaterSequencesShareCachedBlocksAndCopyAPartialOneOnWrite) {
  const auto pool = MakePool(32, 4, 16);
  FakeKv kv(*pool);
  const Tokens prompt = Range(100, 10);  // blocks [100..103] [104..107] and 2 tokens
  ASSERT_TRUE(pool->AddSequence(1).ok());
  ASSERT_TRUE(kv.Append(1, prompt, 0).ok());
  ASSERT_TRUE(pool->CacheCommitted(1, 10).ok());
  EXPECT_EQ(pool->cached_blocks(), 2);  // only full blocks
  const std::vector<int32_t> a = **pool->BlockTable(1);

  // The same 8 tokens and a different tail: both full blocks are reused.
  const Tokens b_prompt = Concat(Range(100, 8), Range(500, 5));
  ASSERT_TRUE(pool->AddSequence(2).ok());
  EXPECT_EQ(*pool->AttachCached(2, b_prompt, 12), 8);
  EXPECT_EQ((**pool->BlockTable(2))[0], a[0]);
  EXPECT_EQ((**pool->BlockTable(2))[1], a[1]);
  EXPECT_EQ(pool->RefCount(a[0]), 2);
  ASSERT_TRUE(kv.Append(2, b_prompt, 8).ok());
  kv.ExpectHolds(2, b_prompt);

  // A full hit: the 8 cached tokens are a whole prompt, so only 7 are attached and the last is
  // fed again into a private copy of the second block (its 3 rows copied first).
  ASSERT_TRUE(pool->AddSequence(3).ok());
  const Tokens c_prompt = Range(100, 8);
  EXPECT_EQ(*pool->AttachCached(3, c_prompt, 7), 7);
  EXPECT_EQ(*pool->Length(3), 7);
  EXPECT_EQ(*pool->BlocksNeeded(3, 1), 1);  // the copy
  ASSERT_TRUE(pool->Append(3, Tokens{107}).ok());
  const std::vector<KvBlockCopy> copies = pool->PendingCopies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a[1]);
  EXPECT_EQ(copies[0].rows, 3);
  EXPECT_EQ(pool->RefCount(a[1]), 3);  // sequences 1 and 2, and the pending copy
  // A pass that failed before its copy ran: back onto the shared block.
  ASSERT_TRUE(pool->Truncate(3, 7).ok());
  pool->RevertCopies();
  EXPECT_EQ(**pool->BlockTable(3), (std::vector<int32_t>{a[0], a[1]}));
  ASSERT_TRUE(kv.Append(3, c_prompt, 7).ok());
  kv.ExpectHolds(3, c_prompt);
  const int32_t copy = (**pool->BlockTable(3))[1];
  EXPECT_NE(copy, a[1]);
  // Its own copy has the same content as the cached block: offering it to the cache swaps in
  // the cached one and frees the copy.
  const int64_t free_before = pool->free_blocks();
  ASSERT_TRUE(pool->CacheCommitted(3, 8).ok());
  EXPECT_EQ((**pool->BlockTable(3))[1], a[1]);
  EXPECT_EQ(pool->RefCount(copy), 0);
  EXPECT_EQ(pool->free_blocks(), free_before + 1);
  kv.ExpectHolds(3, c_prompt);

  // Different parent, same tokens: block [104..107] after [0..3] is not the cached one.
  ASSERT_TRUE(pool->AddSequence(4).ok());
  EXPECT_EQ(*pool->AttachCached(4, Concat(Range(0, 4), Range(104, 4)), 100), 0);
  // A sequence that is not at a block boundary of cached blocks matches nothing.
  ASSERT_TRUE(pool->Truncate(2, 6).ok());
  EXPECT_EQ(*pool->AttachCached(2, Range(106, 10), 100), 0);
}

// Every block hashes alike: only the content check stands between a lookup and wrong KV.
uint64_t CollidingHash(uint64_t, std::span<const int32_t>) { return 42; }

TEST(PrefixCacheTest, AHashCollisionNeverServesAnotherPrefix) {
  const auto pool = MakePool(64, 4, 16, CollidingHash);
  FakeKv kv(*pool);
  const Tokens a = Range(1, 12);
  ASSERT_TRUE(pool->AddSequence(1).ok());
  ASSERT_TRUE(kv.Append(1, a, 0).ok());
  ASSERT_TRUE(pool->CacheCommitted(1, 12).ok());
  // The first block is cached; the second collides with it and stays out.
  EXPECT_EQ(pool->cached_blocks(), 1);
  // The last prompt repeats a's first block: the same tokens at another place in the text, so
  // only the parent tells the cached block apart from what it needs.
  for (const Tokens& prompt :
       {Range(50, 12), Concat(Range(1, 4), Range(60, 8)), a, Concat(Range(1, 4), Range(1, 8))}) {
    const KvPool::SeqId seq = static_cast<KvPool::SeqId>(prompt[4] + prompt[8] + 100);
    ASSERT_TRUE(pool->AddSequence(seq).ok());
    const int64_t hit = *pool->AttachCached(seq, prompt, 11);
    // Only a's own first block may match, and only for prompts that begin with it.
    EXPECT_EQ(hit, prompt[0] == 1 ? 4 : 0);
    ASSERT_TRUE(kv.Append(seq, prompt, hit).ok());
    kv.ExpectHolds(seq, prompt);
    ASSERT_TRUE(pool->CacheCommitted(seq, 12).ok());
  }
  EXPECT_EQ(pool->cached_blocks(), 1);
}

// Records the parent each block hash is given.
std::vector<uint64_t>* parents_seen = nullptr;
uint64_t RecordingHash(uint64_t parent, std::span<const int32_t> tokens) {
  parents_seen->push_back(parent);
  return parent * 31 + static_cast<uint64_t>(tokens[0]);
}

TEST(PrefixCacheTest, TheSaltIsTheRootOfEveryChain) {
  std::vector<uint64_t> seen;
  parents_seen = &seen;
  const auto pool = MakePool(8, 2, 8, RecordingHash, /*salt=*/777);
  ASSERT_TRUE(pool->AddSequence(1).ok());
  ASSERT_TRUE(pool->Append(1, Range(5, 4)).ok());
  ASSERT_TRUE(pool->CacheCommitted(1, 4).ok());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], 777u);
  EXPECT_EQ(seen[1], 777u * 31 + 5);
  parents_seen = nullptr;
}

TEST(PrefixCacheTest, UnreferencedBlocksStayCachedAndAreEvictedLeastRecentlyReleasedFirst) {
  const auto pool = MakePool(6, 2, 6);
  FakeKv kv(*pool);
  // Three sequences of 2 full blocks each fill the pool, then are released in order 1, 2, 3.
  for (KvPool::SeqId seq = 1; seq <= 3; ++seq) {
    ASSERT_TRUE(pool->AddSequence(seq).ok());
    ASSERT_TRUE(kv.Append(seq, Range(static_cast<int32_t>(10 * seq), 4), 0).ok());
    ASSERT_TRUE(pool->CacheCommitted(seq, 4).ok());
  }
  EXPECT_EQ(pool->free_blocks(), 0);
  for (KvPool::SeqId seq = 1; seq <= 3; ++seq) ASSERT_TRUE(pool->Release(seq).ok());
  EXPECT_EQ(pool->cached_blocks(), 6);
  EXPECT_EQ(pool->evictable_blocks(), 6);
  EXPECT_EQ(pool->free_blocks(), 6);  // evictable counts as free
  EXPECT_EQ(pool->used_blocks(), 0);

  // A hit on sequence 2's prefix makes its blocks referenced, so not evictable.
  ASSERT_TRUE(pool->AddSequence(4).ok());
  EXPECT_EQ(*pool->AttachCached(4, Range(20, 5), 4), 4);
  EXPECT_EQ(pool->free_blocks(), 4);
  // Three new blocks evict the three released longest ago: sequence 1's, tail first, then
  // sequence 3's tail.
  ASSERT_TRUE(pool->AddSequence(5).ok());
  ASSERT_TRUE(kv.Append(5, Range(90, 6), 0).ok());
  EXPECT_EQ(pool->free_blocks(), 1);
  for (const auto& [prompt, want] : std::vector<std::pair<Tokens, int64_t>>{
           {Range(10, 5), 0}, {Range(30, 5), 2}, {Range(20, 5), 4}}) {
    ASSERT_TRUE(pool->AddSequence(6).ok());
    EXPECT_EQ(*pool->AttachCached(6, prompt, 4), want) << "prompt from " << prompt[0];
    ASSERT_TRUE(pool->Release(6).ok());
  }
  kv.ExpectHolds(4, Range(20, 4));
}

TEST(PrefixCacheTest, ForkedSequencesShareUntilOneWritesIntoTheSharedPartialBlock) {
  const auto pool = MakePool(16, 4, 8);
  FakeKv kv(*pool);
  const Tokens prompt = Range(1, 6);
  ASSERT_TRUE(pool->AddSequence(1).ok());
  ASSERT_TRUE(kv.Append(1, prompt, 0).ok());
  ASSERT_TRUE(pool->Fork(1, 2).ok());
  EXPECT_EQ(**pool->BlockTable(2), **pool->BlockTable(1));
  EXPECT_EQ(pool->used_blocks(), 2);
  const Tokens one = Concat(prompt, {7, 8});
  const Tokens two = Concat(prompt, {70, 80, 90});
  ASSERT_TRUE(kv.Append(1, one, 6).ok());  // copies the shared partial block
  ASSERT_TRUE(kv.Append(2, two, 6).ok());  // now alone in the original: writes in place
  EXPECT_EQ(pool->used_blocks(), 4);
  EXPECT_EQ((**pool->BlockTable(1))[0], (**pool->BlockTable(2))[0]);
  ASSERT_TRUE(pool->Release(1).ok());
  kv.ExpectHolds(2, two);
  ASSERT_TRUE(pool->Release(2).ok());
  EXPECT_EQ(pool->free_blocks(), 16);
}

// A draft tree's accepted branch moves into place (LlamaEngine::CompactKv): the tokens the pool
// records move with the KV, so the block is cached under the kept child, never under the
// rejected sibling whose slot it was. Slots in blocks others hold are refused, changing nothing.
TEST(PrefixCacheTest, CompactedTreeBranchIsCachedUnderItsOwnTokens) {
  const auto pool = MakePool(16, 4, 8);
  const Tokens prompt = Range(1, 6);
  ASSERT_TRUE(pool->AddSequence(1).ok());
  ASSERT_TRUE(pool->Append(1, prompt).ok());
  ASSERT_TRUE(pool->Append(1, Tokens{40, 41, 42}).ok());  // three children at slots 6, 7, 8
  EXPECT_EQ(pool->CompactTokens(1, 6, std::vector<int32_t>{1, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->CompactTokens(1, 6, std::vector<int32_t>{3}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(pool->CompactTokens(1, 6, std::vector<int32_t>{1}).ok());  // keep 41
  ASSERT_TRUE(pool->Truncate(1, 7).ok());
  ASSERT_TRUE(pool->Append(1, Tokens{77}).ok());  // block 1 is now 5 6 41 77
  ASSERT_TRUE(pool->CacheCommitted(1, 8).ok());
  ASSERT_TRUE(pool->AddSequence(2).ok());
  EXPECT_EQ(*pool->AttachCached(2, Concat(prompt, {41, 77, 9}), 8), 8);
  ASSERT_TRUE(pool->AddSequence(3).ok());
  EXPECT_EQ(*pool->AttachCached(3, Concat(prompt, {40, 77, 9}), 8), 4)
      << "the block was found under the rejected sibling's token";

  // A forked sequence shares the partial block that would be written.
  ASSERT_TRUE(pool->AddSequence(4).ok());
  ASSERT_TRUE(pool->Append(4, Concat(Range(100, 6), {50, 51})).ok());
  ASSERT_TRUE(pool->Fork(4, 5).ok());
  EXPECT_EQ(pool->CompactTokens(4, 6, std::vector<int32_t>{1}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->Release(5).ok());
  EXPECT_TRUE(pool->CompactTokens(4, 6, std::vector<int32_t>{1}).ok());
}

// ------------------------------------------------------------------------------------------------
// The randomized model-checked run.

struct RunShape {
  int64_t num_blocks;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  bool evictions;  // false: big enough that no cached block is ever evicted
  KvBlockHash hash = nullptr;
};

// A hash that ignores the parent and has 5 values: blocks collide all the time, often with the
// same tokens under another parent.
uint64_t WeakHash(uint64_t, std::span<const int32_t> tokens) {
  return static_cast<uint64_t>(tokens[0]) % 5;
}

class PrefixCacheModelTest : public ::testing::TestWithParam<RunShape> {};

TEST_P(PrefixCacheModelTest, RandomSessionsKeepEveryInvariant) {
  const RunShape shape = GetParam();
  const int64_t bs = shape.block_size;
  const int64_t max_len = shape.max_blocks_per_seq * bs;
  for (uint32_t seed = 0; seed < 12; ++seed) {
    SCOPED_TRACE(::testing::Message()
                 << "blocks=" << shape.num_blocks << " block=" << bs << " seed=" << seed);
    std::mt19937 rng(seed);
    auto rand = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    const auto pool = MakePool(shape.num_blocks, bs, shape.max_blocks_per_seq, shape.hash);
    FakeKv kv(*pool);
    // Collisions keep blocks out of the cache: the model's prediction is then an upper bound.
    const bool exact = !shape.evictions && shape.hash == nullptr;
    // The model: each sequence's tokens, and every full-block prefix ever offered to the cache.
    std::map<KvPool::SeqId, Tokens> seqs;
    std::set<Tokens> committed_prefixes;
    std::vector<std::pair<KvPool::SeqId, Tokens>> preempted;  // released, replayed later
    KvPool::SeqId next_id = 1;
    // A few shared system prompts, so prompts share prefixes of many lengths.
    std::vector<Tokens> systems;
    for (int i = 0; i < 3; ++i)
      systems.push_back(Range(1000 * (i + 1), static_cast<int>(rand(bs, 4 * bs))));

    // The longest cached prefix the model predicts for `tokens` from an empty sequence.
    auto predicted_hit = [&](const Tokens& tokens, int64_t max_tokens) {
      int64_t blocks = 0;
      while (
          (blocks + 1) * bs <= static_cast<int64_t>(tokens.size()) &&
          committed_prefixes.contains(Tokens(tokens.begin(), tokens.begin() + (blocks + 1) * bs))) {
        ++blocks;
      }
      return std::min(blocks * bs, max_tokens);
    };
    auto commit = [&](KvPool::SeqId seq, int64_t n) {
      ASSERT_TRUE(pool->CacheCommitted(seq, n).ok());
      const Tokens& t = seqs[seq];
      for (int64_t end = bs; end <= std::min<int64_t>(n, static_cast<int64_t>(t.size()));
           end += bs) {
        committed_prefixes.insert(Tokens(t.begin(), t.begin() + end));
      }
    };
    // A new sequence with `prompt`: the cached prefix, then the rest (or a failed pass).
    auto start = [&](KvPool::SeqId seq, const Tokens& prompt) {
      ASSERT_TRUE(pool->AddSequence(seq).ok());
      const int64_t limit = static_cast<int64_t>(prompt.size()) - 1;
      const int64_t want = predicted_hit(prompt, limit);
      const int64_t hit = *pool->AttachCached(seq, prompt, limit);
      if (exact) {
        ASSERT_EQ(hit, want);
      } else {
        ASSERT_LE(hit, want);
      }
      seqs[seq] = Tokens(prompt.begin(), prompt.begin() + hit);
      const absl::Status st = kv.Append(seq, prompt, hit);
      if (st.ok()) {
        seqs[seq] = prompt;
        if (rand(0, 3) > 0) commit(seq, static_cast<int64_t>(prompt.size()));
      } else {
        ASSERT_TRUE(absl::IsResourceExhausted(st) || absl::IsOutOfRange(st)) << st;
      }
    };

    for (int step = 0; step < 300; ++step) {
      // Blocks anything else holds must not change, whatever the step does.
      std::map<int32_t, uint64_t> shared;
      for (int32_t b = 0; b < pool->total_blocks(); ++b) {
        if (pool->RefCount(b) >= 1 && (pool->RefCount(b) > 1 || pool->IsCached(b))) {
          shared[b] = kv.Checksum(b);
        }
      }
      const int64_t op = rand(0, 9);
      const bool any = !seqs.empty();
      auto it = seqs.begin();
      if (any) std::advance(it, rand(0, static_cast<int64_t>(seqs.size()) - 1));
      if (op <= 2 && !preempted.empty() && rand(0, 1) == 0) {
        // A preempted sequence replays from position 0.
        start(preempted.front().first, preempted.front().second);
        preempted.erase(preempted.begin());
      } else if (op <= 2 || !any) {
        // A new request: a system prompt (or a prefix of one) and a random user turn, or a
        // later turn of a live conversation that resends its history.
        Tokens prompt;
        if (any && rand(0, 2) == 0) {
          prompt = it->second;
        } else {
          const Tokens& sys = systems[static_cast<size_t>(rand(0, 2))];
          prompt.assign(sys.begin(), sys.begin() + rand(0, static_cast<int64_t>(sys.size())));
        }
        const Tokens turn =
            Range(static_cast<int32_t>(rand(0, 40)), static_cast<int>(rand(1, 2 * bs)));
        prompt = Concat(prompt, turn);
        if (static_cast<int64_t>(prompt.size()) > max_len)
          prompt.resize(static_cast<size_t>(max_len));
        start(next_id++, prompt);
      } else if (op <= 4) {
        // A decode round or drafts: a few tokens, sometimes in a pass that fails.
        Tokens grown = Concat(
            it->second, Range(static_cast<int32_t>(rand(0, 9)), static_cast<int>(rand(1, bs + 1))));
        const int64_t old_len = static_cast<int64_t>(it->second.size());
        const bool fail = rand(0, 5) == 0;
        const absl::Status st = kv.Append(it->first, grown, old_len, fail);
        if (st.ok() && !fail) {
          it->second = grown;
          if (rand(0, 1) == 0) commit(it->first, rand(0, static_cast<int64_t>(grown.size())));
        }
      } else if (op == 5) {
        // Rejected drafts, or a resync after a failure: truncate anywhere.
        const int64_t keep = rand(0, static_cast<int64_t>(it->second.size()));
        ASSERT_TRUE(pool->Truncate(it->first, keep).ok());
        it->second.resize(static_cast<size_t>(keep));
      } else if (op == 6) {
        ASSERT_TRUE(pool->Release(it->first).ok());
        seqs.erase(it);
      } else if (op == 7) {
        // Preemption: released now, replayed from position 0 in a later step.
        ASSERT_TRUE(pool->Release(it->first).ok());
        if (!it->second.empty()) preempted.emplace_back(it->first, it->second);
        seqs.erase(it);
      } else if (op == 8) {
        const KvPool::SeqId child = next_id++;
        ASSERT_TRUE(pool->Fork(it->first, child).ok());
        seqs[child] = it->second;
      } else {
        commit(it->first, rand(0, static_cast<int64_t>(it->second.size())));
      }

      // Invariants.
      std::map<int32_t, int32_t> refs;  // the model's count: table entries naming the block
      for (const auto& [seq, tokens] : seqs) {
        ASSERT_EQ(*pool->Length(seq), static_cast<int64_t>(tokens.size())) << "sequence " << seq;
        const std::vector<int32_t>& table = **pool->BlockTable(seq);
        ASSERT_EQ(static_cast<int64_t>(table.size()),
                  (static_cast<int64_t>(tokens.size()) + bs - 1) / bs);
        for (const int32_t b : table) ++refs[b];
        kv.ExpectHolds(seq, tokens);
      }
      int64_t free = 0, cached = 0, evictable = 0;
      for (int32_t b = 0; b < pool->total_blocks(); ++b) {
        ASSERT_EQ(pool->RefCount(b), refs[b]) << "block " << b << ", step " << step;
        free += refs[b] == 0;
        cached += pool->IsCached(b);
        evictable += refs[b] == 0 && pool->IsCached(b);
      }
      ASSERT_EQ(pool->free_blocks(), free);
      ASSERT_EQ(pool->cached_blocks(), cached);
      ASSERT_EQ(pool->evictable_blocks(), evictable);
      if (exact) {
        // Nothing was evicted, and twins were merged: one cached block per committed prefix.
        ASSERT_EQ(cached, static_cast<int64_t>(committed_prefixes.size()));
      }
      for (const auto& [b, checksum] : shared) {
        if (pool->RefCount(b) > 0 || pool->IsCached(b)) {
          ASSERT_EQ(kv.Checksum(b), checksum) << "shared block " << b << " changed, step " << step;
        }
      }
    }
    // Every block returns to the free list or the cache.
    for (const auto& [seq, tokens] : seqs) ASSERT_TRUE(pool->Release(seq).ok());
    EXPECT_EQ(pool->used_blocks(), 0);
    EXPECT_EQ(pool->free_blocks(), shape.num_blocks);
    EXPECT_EQ(pool->evictable_blocks(), pool->cached_blocks());
    for (int32_t b = 0; b < pool->total_blocks(); ++b) EXPECT_EQ(pool->RefCount(b), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PrefixCacheModelTest,
                         ::testing::Values(RunShape{4096, 4, 64, false},
                                           RunShape{4096, 1, 64, false}, RunShape{24, 4, 16, true},
                                           RunShape{60, 3, 12, true}, RunShape{9, 8, 4, true},
                                           RunShape{4096, 2, 64, false, WeakHash},
                                           RunShape{40, 1, 32, true, WeakHash}));

}  // namespace
}  // namespace specd
