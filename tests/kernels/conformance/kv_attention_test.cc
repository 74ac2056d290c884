// Conformance of the paged KV cache ops (StoreKv, Rope with a store, CopyKvRows) and paged
// attention on every available back end, for f32, bf16 and f16 caches: a decode token, a
// catch-up, a K+1 verify and a draft tree in one varlen batch over a shuffled block table, against
// a double-precision reference computed from the cache contents read back; plus batch invariance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/conformance/backend_under_test.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels::conformance {
namespace {

using cpu_test::AllClose;
using cpu_test::RandomFloats;
using cpu_test::RefDecodeBf16;
using cpu_test::RefDecodeF16;
using cpu_test::SameBits;

double Decode(DType dtype, const std::vector<uint8_t>& bytes, int64_t i) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, &bytes[static_cast<size_t>(i * 4)], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[static_cast<size_t>(i * 2)], 2);
  return dtype == DType::kF16 ? RefDecodeF16(h) : RefDecodeBf16(h);
}

// Four sequences over a shuffled paged cache. Sequences 0-2 are plain (lengths 1, 9, 23); the
// batch asks for their last 1, 4 and 5 tokens (a decode step, a catch-up, a K+1 verify).
// Sequence 3 holds a 10-token prefix and a 6-node draft tree:
//        prefix -> n0 -> n1 -> n3
//                     -> n2 -> n4 -> n5
// (n1 and n2 are siblings at one depth; each node sees its ancestors and itself).
class KvAttentionTest : public BackendTest {
 protected:
  static constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 16, kBlock = 4;
  static constexpr int64_t kKvDim = kKvHeads * kHeadDim, kWidth = kHeads * kHeadDim;
  static constexpr int64_t kLens[4] = {1, 9, 23, 16};
  static constexpr int64_t kTreeStart = 10;

  void Build(DType dtype) {
    dtype_ = dtype;
    stored_k_.clear();
    stored_v_.clear();
    qseq_.clear();
    qslot_.clear();
    qmask_.clear();
    qmask_start_.clear();
    max_blocks_ = 8;
    num_blocks_ = 4 * max_blocks_ + 3;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks_));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    tables_.assign(static_cast<size_t>(4 * max_blocks_), -1);
    size_t next = 0;
    for (int s = 0; s < 4; ++s) {
      for (int64_t b = 0; b * kBlock < kLens[s]; ++b) tables_[s * max_blocks_ + b] = ids[next++];
    }
    const int64_t cache_elems = num_blocks_ * kBlock * kKvDim;
    k_ = device().Output<uint8_t>(cache_elems * DTypeSize(dtype));
    v_ = device().Output<uint8_t>(cache_elems * DTypeSize(dtype));
    tables_d_ = device().Put(tables_);
    // Store every slot of every sequence in a shuffled order and uneven batches.
    std::vector<std::pair<int32_t, int32_t>> slots;
    for (int s = 0; s < 4; ++s) {
      for (int32_t p = 0; p < kLens[s]; ++p) slots.emplace_back(s, p);
    }
    std::shuffle(slots.begin(), slots.end(), rng_);
    for (size_t begin = 0; begin < slots.size(); begin += 7) {
      const size_t end = std::min(slots.size(), begin + 7);
      std::vector<int32_t> seq, slot;
      for (size_t i = begin; i < end; ++i) {
        seq.push_back(slots[i].first);
        slot.push_back(slots[i].second);
      }
      const int64_t n = static_cast<int64_t>(seq.size());
      const std::vector<float> k = RandomFloats(n * kKvDim, rng_, -2.0f, 2.0f);
      const std::vector<float> v = RandomFloats(n * kKvDim, rng_, -2.0f, 2.0f);
      for (int64_t i = 0; i < n; ++i) {
        stored_k_[{seq[i], slot[i]}].assign(k.begin() + i * kKvDim, k.begin() + (i + 1) * kKvDim);
        stored_v_[{seq[i], slot[i]}].assign(v.begin() + i * kKvDim, v.begin() + (i + 1) * kKvDim);
      }
      const absl::Status st = backend().StoreKv(
          {device().Put(k), device().Put(v), Cache(), device().Put(seq), device().Put(slot), n});
      ASSERT_TRUE(st.ok()) << st;
    }
    k_host_ = device().Get(k_, cache_elems * DTypeSize(dtype));
    v_host_ = device().Get(v_, cache_elems * DTypeSize(dtype));

    // The query batch.
    const int64_t first[3] = {0, 5, 18};
    for (int s = 0; s < 3; ++s) {
      for (int64_t p = first[s]; p < kLens[s]; ++p) AddQuery(s, static_cast<int32_t>(p), 0, 0);
    }
    const uint64_t masks[6] = {0b000001, 0b000011, 0b000101, 0b001011, 0b010101, 0b110101};
    for (int j = 0; j < 6; ++j)
      AddQuery(3, static_cast<int32_t>(kTreeStart + j), masks[j], kTreeStart);
    q_ = RandomFloats(static_cast<int64_t>(qseq_.size()) * kWidth, rng_);
  }

  void AddQuery(int32_t seq, int32_t slot, uint64_t mask, int32_t mask_start) {
    qseq_.push_back(seq);
    qslot_.push_back(slot);
    // A plain token sees every earlier slot and itself: the causal mask.
    qmask_.push_back(mask != 0 ? mask : 1);
    qmask_start_.push_back(mask != 0 ? mask_start : slot);
  }

  PagedKv Cache() {
    return {.k = k_,
            .v = v_,
            .dtype = dtype_,
            .block_tables = tables_d_,
            .max_blocks = max_blocks_,
            .num_blocks = num_blocks_,
            .block_size = kBlock,
            .kv_dim = kKvDim};
  }

  // Attention outputs of query tokens `rows`, fed in that order.
  std::vector<float> Attend(const std::vector<int>& rows) {
    std::vector<int32_t> seq, slot, start;
    std::vector<uint64_t> mask;
    std::vector<float> q;
    for (const int r : rows) {
      seq.push_back(qseq_[r]);
      slot.push_back(qslot_[r]);
      mask.push_back(qmask_[r]);
      start.push_back(qmask_start_[r]);
      q.insert(q.end(), q_.begin() + r * kWidth, q_.begin() + (r + 1) * kWidth);
    }
    return AttendOver(Cache(), seq, slot, mask, start, q, /*masks=*/true);
  }

  // Attention over `cache` of tokens (seq[i], slot[i]) with queries q ([n, kWidth]), with tree
  // masks (mask[i] from start[i]) or, when !masks, none (tree_mask == nullptr: causal).
  std::vector<float> AttendOver(const PagedKv& cache, const std::vector<int32_t>& seq,
                                const std::vector<int32_t>& slot, const std::vector<uint64_t>& mask,
                                const std::vector<int32_t>& start, const std::vector<float>& q,
                                bool masks) {
    const int64_t n = static_cast<int64_t>(seq.size());
    float* out = device().Output<float>(n * kWidth);
    AttentionArgs a;
    a.q = device().Put(q);
    a.out = out;
    a.cache = cache;
    a.token_seq = device().Put(seq);
    a.slot = device().Put(slot);
    a.tree_mask = masks ? device().Put(mask) : nullptr;
    a.mask_start = masks ? device().Put(start) : nullptr;
    a.n_tokens = n;
    a.n_heads = kHeads;
    a.n_kv_heads = kKvHeads;
    a.head_dim = kHeadDim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    const absl::Status st = backend().Attention(a);
    EXPECT_TRUE(st.ok()) << st;
    return device().Get(out, n * kWidth);
  }

  // Element offset of (seq, slot, i) in the cache.
  int64_t Offset(int32_t seq, int32_t slot, int64_t i) const {
    const int64_t block = tables_[seq * max_blocks_ + slot / kBlock];
    return (block * kBlock + slot % kBlock) * kKvDim + i;
  }

  std::vector<double> Reference() const {
    std::vector<double> want(q_.size());
    for (size_t t = 0; t < qseq_.size(); ++t) {
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t kvh = h / (kHeads / kKvHeads);
        std::vector<double> w;
        std::vector<int32_t> seen;
        for (int32_t s = 0; s <= qslot_[t]; ++s) {
          const bool visible =
              s < qmask_start_[t] || ((qmask_[t] >> (s - qmask_start_[t])) & 1) != 0;
          if (!visible) continue;
          double dot = 0;
          for (int64_t d = 0; d < kHeadDim; ++d) {
            dot += q_[t * kWidth + h * kHeadDim + d] *
                   Decode(dtype_, k_host_, Offset(qseq_[t], s, kvh * kHeadDim + d));
          }
          w.push_back(dot / std::sqrt(static_cast<double>(kHeadDim)));
          seen.push_back(s);
        }
        const double m = *std::max_element(w.begin(), w.end());
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - m));
        for (int64_t d = 0; d < kHeadDim; ++d) {
          double acc = 0;
          for (size_t j = 0; j < seen.size(); ++j) {
            acc += w[j] * Decode(dtype_, v_host_, Offset(qseq_[t], seen[j], kvh * kHeadDim + d));
          }
          want[t * kWidth + h * kHeadDim + d] = acc / sum;
        }
      }
    }
    return want;
  }

  DType dtype_ = DType::kF32;
  int64_t max_blocks_ = 0, num_blocks_ = 0;
  std::vector<int32_t> tables_;
  uint8_t* k_ = nullptr;
  uint8_t* v_ = nullptr;
  int32_t* tables_d_ = nullptr;
  std::vector<uint8_t> k_host_, v_host_;
  std::map<std::pair<int32_t, int32_t>, std::vector<float>> stored_k_, stored_v_;
  std::vector<int32_t> qseq_, qslot_, qmask_start_;
  std::vector<uint64_t> qmask_;
  std::vector<float> q_;
};

TEST_P(KvAttentionTest, StoreKvRoundsEachValueToTheCacheDtype) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (!backend().SupportsKvDtype(dtype)) continue;
    Build(dtype);
    // Relative rounding bound of the cache type: half an ulp.
    const double rel = dtype == DType::kF32 ? 0.0 : dtype == DType::kBF16 ? 0x1p-8 : 0x1p-11;
    for (const auto& [key, values] : stored_k_) {
      for (int64_t i = 0; i < kKvDim; ++i) {
        const double got = Decode(dtype, k_host_, Offset(key.first, key.second, i));
        const double want = values[static_cast<size_t>(i)];
        ASSERT_LE(std::fabs(got - want), rel * std::fabs(want) + 1e-7)
            << DTypeName(dtype) << " seq " << key.first << " slot " << key.second;
      }
    }
  }
}

// The layer's Rope stores the keys it rotates, and the values beside them, in the same call: the
// queries, keys and every cache byte have the bits of Rope then StoreKv, for every cache dtype.
TEST_P(KvAttentionTest, ARopeThatStoresHasTheBitsOfRopeThenStoreKv) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (!backend().SupportsKvDtype(dtype)) continue;
    Build(dtype);
    // Sequence 1's nine slots in a shuffled order, at positions apart from their slots.
    std::vector<int32_t> slot(9);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng_);
    const int64_t n = static_cast<int64_t>(slot.size());
    const std::vector<int32_t> seq(slot.size(), 1);
    std::vector<int32_t> pos;
    for (const int32_t s : slot) pos.push_back(s + 3);
    std::vector<float> inv_freq;
    for (int64_t i = 0; i < kHeadDim / 2; ++i) {
      inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / kHeadDim)));
    }
    const std::vector<float> q = RandomFloats(n * kWidth, rng_, -2.0f, 2.0f);
    const std::vector<float> k = RandomFloats(n * kKvDim, rng_, -2.0f, 2.0f);
    const std::vector<float> v = RandomFloats(n * kKvDim, rng_, -2.0f, 2.0f);
    const int32_t* dseq = device().Put(seq);
    const int32_t* dslot = device().Put(slot);
    const int32_t* dpos = device().Put(pos);
    const float* dfreq = device().Put(inv_freq);
    const int64_t cache_bytes = num_blocks_ * kBlock * kKvDim * DTypeSize(dtype);

    float* qa = device().Put(q);
    float* ka = device().Put(k);
    ASSERT_TRUE(backend().Rope({qa, dpos, dfreq, n, kHeads, kHeadDim, ka, kKvHeads}).ok());
    ASSERT_TRUE(backend().StoreKv({ka, device().Put(v), Cache(), dseq, dslot, n}).ok());
    const std::vector<uint8_t> k_separate = device().Get(k_, cache_bytes);
    const std::vector<uint8_t> v_separate = device().Get(v_, cache_bytes);

    // Other values in those slots first, so that the call must write every byte it owns.
    const std::vector<float> other = RandomFloats(n * kKvDim, rng_);
    ASSERT_TRUE(backend()
                    .StoreKv({device().Put(other), device().Put(other), Cache(), dseq, dslot, n})
                    .ok());
    float* qb = device().Put(q);
    float* kb = device().Put(k);
    const StoreKvArgs store{kb, device().Put(v), Cache(), dseq, dslot, n};
    const absl::Status st =
        backend().Rope({qb, dpos, dfreq, n, kHeads, kHeadDim, kb, kKvHeads, store});
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(SameBits(device().Get(qb, n * kWidth), device().Get(qa, n * kWidth)))
        << DTypeName(dtype);
    EXPECT_TRUE(SameBits(device().Get(kb, n * kKvDim), device().Get(ka, n * kKvDim)))
        << DTypeName(dtype);
    EXPECT_EQ(device().Get(k_, cache_bytes), k_separate) << DTypeName(dtype);
    EXPECT_EQ(device().Get(v_, cache_bytes), v_separate) << DTypeName(dtype);

    // A store of anything but the rotated keys is refused before anything runs.
    StoreKvArgs wrong = store;
    wrong.k = qb;
    const absl::Status refused =
        backend().Rope({qb, dpos, dfreq, n, kHeads, kHeadDim, kb, kKvHeads, wrong});
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused.message()),
                ::testing::HasSubstr("Rope: store must store the rotated x2"));
    EXPECT_TRUE(SameBits(device().Get(qb, n * kWidth), device().Get(qa, n * kWidth)));
  }
}

TEST_P(KvAttentionTest, AttentionMatchesReferenceForDecodeVerifyPrefillAndTrees) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (!backend().SupportsKvDtype(dtype)) continue;
    Build(dtype);
    std::vector<int> all(qseq_.size());
    std::iota(all.begin(), all.end(), 0);
    const std::vector<float> out = Attend(all);
    EXPECT_TRUE(AllClose(out.data(), Reference(), {1e-5}, 1e-4)) << DTypeName(dtype);
    // Each query alone, and in shuffled batches, gives the same bits.
    const int n = static_cast<int>(all.size());
    for (const int r : {0, 3, n - 1}) {
      for (const std::vector<int>& batch : InvarianceBatches(n, r, rng_)) {
        const std::vector<float> got = Attend(batch);
        const int at = static_cast<int>(std::find(batch.begin(), batch.end(), r) - batch.begin());
        EXPECT_TRUE(
            SameBits(std::vector<float>(got.begin() + at * kWidth, got.begin() + (at + 1) * kWidth),
                     std::vector<float>(out.begin() + r * kWidth, out.begin() + (r + 1) * kWidth)))
            << DTypeName(dtype) << ": query " << r << " in a batch of " << batch.size();
      }
    }
  }
}

TEST_P(KvAttentionTest, CopyKvRowsReadsEverySourceBeforeWriting) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t layers = 3, stride = 20, kv_dim = 8;
    const int64_t bytes = layers * stride * kv_dim * DTypeSize(dtype);
    std::vector<uint8_t> k(static_cast<size_t>(bytes)), v(static_cast<size_t>(bytes));
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : k) b = static_cast<uint8_t>(byte(rng_));
    for (uint8_t& b : v) b = static_cast<uint8_t>(byte(rng_));
    uint8_t* kd = device().Put(k);
    uint8_t* vd = device().Put(v);
    // A chain (rows 5, 6, 7 move down by one, as an accepted tree branch compacts) and a
    // copy-on-write of rows 16..19 into 0..3.
    const std::vector<int32_t> src = {5, 6, 7, 16, 17, 18, 19};
    const std::vector<int32_t> dst = {4, 5, 6, 0, 1, 2, 3};
    CopyKvRowsArgs a{kd,
                     vd,
                     dtype,
                     layers,
                     stride,
                     kv_dim,
                     device().Put(src),
                     device().Put(dst),
                     static_cast<int64_t>(src.size())};
    ASSERT_TRUE(backend().CopyKvRows(a).ok());
    const int64_t row = kv_dim * DTypeSize(dtype);
    for (const auto& [before, got] :
         {std::pair{k, device().Get(kd, bytes)}, std::pair{v, device().Get(vd, bytes)}}) {
      std::vector<uint8_t> want = before;
      for (int64_t l = 0; l < layers; ++l) {
        for (size_t i = 0; i < src.size(); ++i) {
          std::memcpy(&want[(l * stride + dst[i]) * row], &before[(l * stride + src[i]) * row],
                      static_cast<size_t>(row));
        }
      }
      EXPECT_EQ(got, want) << DTypeName(dtype);
    }
  }
}

// A draft-tree node attends over its prefix and its ancestors, which sit at slots with holes
// between them. Once the path is accepted its tokens are fed again at consecutive slots, so the
// node must get exactly the bits of the path's last token seeing the same keys there: a hidden
// slot changes no sum, and wherever a back end cuts the keys into pieces must not depend on the
// holes. The trees straddle a 64-slot boundary (past a 60-token prefix) and a 512-slot one (past
// 500); the linear token runs both with a causal tree mask and with no mask at all.
TEST_P(KvAttentionTest, ATreeNodeGetsTheBitsOfItsPathStoredLinearly) {
  constexpr int64_t kBlockSize = 16, kTreeNodes = 40;
  // The node's ancestors and itself, as offsets from the tree's first slot.
  const std::vector<int32_t> path = {0, 3, 7, 12, 20, 33};
  const int64_t depth = static_cast<int64_t>(path.size());
  uint64_t path_mask = 0;
  for (const int32_t node : path) path_mask |= uint64_t{1} << node;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    if (!backend().SupportsKvDtype(dtype)) continue;
    for (const int32_t prefix : {60, 500}) {
      // Sequence 0 holds the prefix and the tree, sequence 1 the prefix and the path; their
      // tables run in opposite directions over one pool.
      const int64_t len = prefix + kTreeNodes;
      const int64_t max_blocks = (len + kBlockSize - 1) / kBlockSize;
      const int64_t num_blocks = 2 * max_blocks;
      std::vector<int32_t> tables(static_cast<size_t>(2 * max_blocks));
      for (int64_t b = 0; b < max_blocks; ++b) {
        tables[b] = static_cast<int32_t>(b);
        tables[max_blocks + b] = static_cast<int32_t>(num_blocks - 1 - b);
      }
      const int64_t pool_bytes = num_blocks * kBlockSize * kKvDim * DTypeSize(dtype);
      const PagedKv cache{device().Output<uint8_t>(pool_bytes),
                          device().Output<uint8_t>(pool_bytes),
                          dtype,
                          device().Put(tables),
                          max_blocks,
                          num_blocks,
                          kBlockSize,
                          kKvDim};
      const std::vector<float> k = RandomFloats(len * kKvDim, rng_, -2.0f, 2.0f);
      const std::vector<float> v = RandomFloats(len * kKvDim, rng_, -2.0f, 2.0f);
      // Row r of k and v goes to (seq[i], slot[i]) for each i with rows[i] = r.
      std::vector<int32_t> seq, slot, rows;
      for (int32_t i = 0; i < len; ++i) {
        seq.push_back(0);
        slot.push_back(i);
        rows.push_back(i);
      }
      for (int32_t i = 0; i < prefix + depth; ++i) {
        seq.push_back(1);
        slot.push_back(i);
        rows.push_back(i < prefix ? i : prefix + path[i - prefix]);
      }
      std::vector<float> k_rows, v_rows;
      for (const int32_t r : rows) {
        k_rows.insert(k_rows.end(), k.begin() + r * kKvDim, k.begin() + (r + 1) * kKvDim);
        v_rows.insert(v_rows.end(), v.begin() + r * kKvDim, v.begin() + (r + 1) * kKvDim);
      }
      const absl::Status stored =
          backend().StoreKv({device().Put(k_rows), device().Put(v_rows), cache, device().Put(seq),
                             device().Put(slot), static_cast<int64_t>(seq.size())});
      ASSERT_TRUE(stored.ok()) << stored;

      const std::vector<float> q = RandomFloats(kWidth, rng_);
      const int32_t node_slot = prefix + path.back();
      const int32_t linear_slot = static_cast<int32_t>(prefix + depth - 1);
      // Tokens (seq, slot, mask, mask_start), each with the same query.
      struct Token {
        int32_t seq, slot;
        uint64_t mask;
        int32_t mask_start;
      };
      const auto attend = [&](const std::vector<Token>& tokens, bool masks) {
        std::vector<int32_t> t_seq, t_slot, t_start;
        std::vector<uint64_t> t_mask;
        std::vector<float> t_q;
        for (const Token& t : tokens) {
          t_seq.push_back(t.seq);
          t_slot.push_back(t.slot);
          t_mask.push_back(t.mask);
          t_start.push_back(t.mask_start);
          t_q.insert(t_q.end(), q.begin(), q.end());
        }
        return AttendOver(cache, t_seq, t_slot, t_mask, t_start, t_q, masks);
      };
      const Token node{0, node_slot, path_mask, prefix};
      const Token linear{1, linear_slot, 1, linear_slot};
      const std::string where = absl::StrCat(std::string(DTypeName(dtype)), ", prefix ", prefix);
      const std::vector<float> want = attend({linear}, /*masks=*/false);
      EXPECT_TRUE(SameBits(attend({linear}, /*masks=*/true), want)) << where;
      EXPECT_TRUE(SameBits(attend({node}, /*masks=*/true), want)) << where;
      const std::vector<float> both = attend({linear, node}, /*masks=*/true);
      EXPECT_TRUE(SameBits(std::vector<float>(both.begin() + kWidth, both.end()), want)) << where;
      EXPECT_TRUE(device().GuardsIntact()) << where;
    }
  }
}

// One message per bad call, whichever back end runs it. Each case is one where the CUDA launcher
// used to disagree with the CPU: another message, or no check at all.
TEST_P(KvAttentionTest, BadArgumentsGetTheSameMessageOnEveryBackEnd) {
  // Two tokens, 2 heads of 4 over 1 KV head, a cache of 4 blocks of 2 slots.
  const std::vector<float> zeros(32, 0.0f);
  const PagedKv cache{device().Put(zeros),
                      device().Put(zeros),
                      DType::kF32,
                      device().Put(std::vector<int32_t>{0, 1, 2, 3}),
                      2,
                      4,
                      2,
                      4};
  const AttentionArgs good{.q = device().Put(std::vector<float>(16, 1.0f)),
                           .out = device().Output<float>(16),
                           .cache = cache,
                           .token_seq = device().Put(std::vector<int32_t>{0, 1}),
                           .slot = device().Put(std::vector<int32_t>{3, 1}),
                           .n_tokens = 2,
                           .n_heads = 2,
                           .n_kv_heads = 1,
                           .head_dim = 4,
                           .scale = 0.5f};
  ASSERT_TRUE(backend().Attention(good).ok());
  AttentionArgs a = good;
  a.n_kv_heads = 3;
  EXPECT_TRUE(IsInvalidArgument(backend().Attention(a),
                                "Attention: n_heads (2) must be a multiple of n_kv_heads (3)"));
  a = good;
  a.head_dim = 2;
  EXPECT_TRUE(
      IsInvalidArgument(backend().Attention(a),
                        "Attention: cache.kv_dim (4) must equal n_kv_heads x head_dim (1 x 2)"));
  a = good;
  a.n_heads = int64_t{1} << 30;
  a.head_dim = int64_t{1} << 20;
  EXPECT_TRUE(IsInvalidArgument(
      backend().Attention(a),
      "Attention: n_heads x head_dim = 1073741824 x 1048576 elements is out of range"));
  a = good;
  a.scale = INFINITY;
  EXPECT_TRUE(IsInvalidArgument(backend().Attention(a), "Attention: scale must be finite"));
  EXPECT_TRUE(IsInvalidArgument(
      backend().StoreKv({nullptr, nullptr, cache, nullptr, nullptr, int64_t{1} << 47}),
      "StoreKv: n_tokens x cache.kv_dim = 140737488355328 x 4 elements is out of range"));
  EXPECT_TRUE(IsInvalidArgument(
      backend().CopyKvRows(
          {cache.k, cache.v, DType::kF32, 2, int64_t{1} << 45, 8, nullptr, nullptr, 0}),
      "CopyKvRows: n_layers x layer_stride x kv_dim = 70368744177664 x 8 elements is out of "
      "range"));
}

INSTANTIATE_TEST_SUITE_P(Backends, KvAttentionTest, ::testing::ValuesIn(AllBackends()), CaseName);

}  // namespace
}  // namespace specd::kernels::conformance
