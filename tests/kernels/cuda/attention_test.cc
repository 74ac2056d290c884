// CUDA attention and KV-cache checks beyond the conformance suite (which runs both ops on this
// back end too, over small shapes: tests/kernels/conformance/kv_attention_test.cc):
//  * the split form (a block per 128-key chunk group, the last to finish merging) and the
//    single-block form give the same bits, in a batch or alone, and match a double-precision
//    reference: f32, bf16 and f16 caches, head_dim 64 and 128, 1 to 8 query heads per KV head,
//    contexts of one slot to fourteen chunk groups, a draft tree across a chunk group boundary;
//  * split attention recorded as a CUDA graph replays with new slots to the eager bits, twice in
//    a row (the graph resets its arrival counters);
//  * a bad block-table entry, slot or tree mask fails the next Synchronize, naming the op and
//    the field (a tree mask in the CPU's words), zeros every head of that token and nothing else,
//    and the next pass is clean;
//  * CopyKvRows over many column tiles, chained pairs included, moves rows as a host copy does.
// Every test skips, saying why, where no CUDA device is present.
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kv_cache.h"
#include "tests/kernels/conformance/backend_under_test.h"
#include "tests/kernels/cpu/reference.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace specd::kernels {
namespace {

using conformance::Device;
using cpu_test::RandomFloats;
using cpu_test::RandomWeight;
using cpu_test::SameBits;
using cpu_test::TestWeight;
using cuda_test::CudaTest;
using cuda_test::CudaTestBase;
using cuda_test::MakeCuda;

// Slots per chunk group: the split form's unit of work.
constexpr int64_t kGroupSlots = cuda::kAttentionChunk * cuda::kAttentionGroupChunks;

struct Shape {
  const char* name;
  DType dtype;
  int64_t kv_heads, group, head_dim;  // group: query heads per KV head

  int64_t heads() const { return kv_heads * group; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t width() const { return heads() * head_dim; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

// One query token: its sequence and slot, its tree mask (a plain token has bit 0 at
// mask_start = slot: it sees its own slot and everything before), and its q row.
struct Query {
  int32_t seq = 0, slot = 0;
  uint64_t mask = 1;
  int32_t mask_start = 0;
  std::vector<float> q;  // [heads * head_dim]
};

// Six sequences in a shuffled paged cache of random contents, whose exact values the reference
// reads. 16-slot blocks, block tables of 2048 slots (sixteen chunk groups of 128), and queries:
//   seq 0: 1700 slots (fourteen groups, the last partly filled): a decode token and a 4-token
//          verify;
//   seq 1: 512 slots, exactly four groups: its last slot, and slot 0 (one visible slot);
//   seq 2: 1025 slots: slot 1024 (a ninth group of one slot) and 1023 (exactly eight groups);
//   seq 3: 513 slots: slot 512 (a fifth group of one slot);
//   seq 4: a 1020-slot prefix and a 10-node draft tree at slots 1020..1029, across the boundary
//          of groups 7 and 8 (and of chunks 15 and 16);
//   seq 5: 70 slots, two chunks of one group.
class PagedCase {
 public:
  static constexpr int64_t kBlock = 16, kMaxBlocks = 128, kNumBlocks = 320;
  static constexpr int32_t kTreeStart = 1020;

  PagedCase(const Shape& shape, std::mt19937& rng) : shape_(shape) {
    static_assert(kMaxBlocks * kBlock == 16 * kGroupSlots);
    const std::vector<int64_t> lens = {1700, 512, 1025, 513, kTreeStart + 10, 70};
    std::vector<int32_t> ids(kNumBlocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables_.assign(lens.size() * kMaxBlocks, -1);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t b = 0; b * kBlock < lens[s]; ++b) tables_[s * kMaxBlocks + b] = ids[next++];
    }
    k_ = RandomWeight(shape.dtype, kNumBlocks * kBlock, shape.kv_dim(), rng);
    v_ = RandomWeight(shape.dtype, kNumBlocks * kBlock, shape.kv_dim(), rng);
    const std::pair<int32_t, int32_t> plain[] = {{0, 1699}, {0, 1695}, {0, 1696}, {0, 1697},
                                                 {0, 1698}, {1, 511},  {1, 0},    {2, 1024},
                                                 {2, 1023}, {3, 512},  {5, 69}};
    for (const auto& [seq, slot] : plain) queries_.push_back(Plain(seq, slot, rng));
    // Node j at slot kTreeStart + j sees its ancestors and itself (bit i = node i):
    //   0 -> 1 -> 3 -> 5 -> 7,  0 -> 2 -> 4 -> 6 -> 8,  0 -> 9.
    const uint64_t tree[10] = {0b1,      0b11,      0b101,      0b1011,      0b10101,
                               0b101011, 0b1010101, 0b10101011, 0b101010101, 0b1000000001};
    for (int32_t j = 0; j < 10; ++j) {
      queries_.push_back(
          {4, kTreeStart + j, tree[j], kTreeStart, RandomFloats(shape.width(), rng, -2, 2)});
    }
  }

  // A plain (causal) token.
  Query Plain(int32_t seq, int32_t slot, std::mt19937& rng) const {
    return {seq, slot, 1, slot, RandomFloats(shape_.width(), rng, -2, 2)};
  }

  const Shape& shape() const { return shape_; }
  const std::vector<Query>& queries() const { return queries_; }
  const std::vector<int32_t>& tables() const { return tables_; }

  // The cache in `device`'s back end, with `tables` as its block tables (default: the case's).
  PagedKv Place(Device& device, const std::vector<int32_t>* tables = nullptr) const {
    return {device.Put(k_.bytes),
            device.Put(v_.bytes),
            shape_.dtype,
            device.Put(tables != nullptr ? *tables : tables_),
            kMaxBlocks,
            kNumBlocks,
            kBlock,
            shape_.kv_dim()};
  }

  // Head h of `query`'s output [head_dim], in double precision from the cache's exact values.
  std::vector<double> Reference(const Query& query, int64_t h) const {
    const int64_t hd = shape_.head_dim;
    const int64_t kv_offset = h / shape_.group * hd;
    std::vector<double> w;
    std::vector<int64_t> rows;
    for (int64_t s = 0; s <= query.slot; ++s) {
      if (s >= query.mask_start && ((query.mask >> (s - query.mask_start)) & 1) == 0) continue;
      const int64_t row = tables_[query.seq * kMaxBlocks + s / kBlock] * kBlock + s % kBlock;
      double dot = 0;
      for (int64_t i = 0; i < hd; ++i) {
        dot += double{query.q[h * hd + i]} * k_.values[row * shape_.kv_dim() + kv_offset + i];
      }
      w.push_back(dot * shape_.scale());
      rows.push_back(row);
    }
    const double m = *std::max_element(w.begin(), w.end());
    double sum = 0;
    for (double& x : w) sum += (x = std::exp(x - m));
    std::vector<double> out(hd, 0.0);
    for (size_t j = 0; j < rows.size(); ++j) {
      for (int64_t d = 0; d < hd; ++d) {
        out[d] += w[j] * v_.values[rows[j] * shape_.kv_dim() + kv_offset + d];
      }
    }
    for (double& x : out) x /= sum;
    return out;
  }

 private:
  Shape shape_;
  std::vector<int32_t> tables_;
  TestWeight k_, v_;  // [kNumBlocks * kBlock, kv_dim] of the cache's dtype, and exact values
  std::vector<Query> queries_;
};

// A batch's arrays in a back end's memory; `out` starts as sentinels.
struct BatchArrays {
  float* q;
  int32_t* seq;
  int32_t* slot;
  uint64_t* mask;
  int32_t* mask_start;
  float* out;
  int64_t n;
};

struct HostBatch {
  std::vector<float> q;
  std::vector<int32_t> seq, slot, mask_start;
  std::vector<uint64_t> mask;
};

HostBatch Flatten(const std::vector<Query>& batch) {
  HostBatch h;
  for (const Query& t : batch) {
    h.q.insert(h.q.end(), t.q.begin(), t.q.end());
    h.seq.push_back(t.seq);
    h.slot.push_back(t.slot);
    h.mask.push_back(t.mask);
    h.mask_start.push_back(t.mask_start);
  }
  return h;
}

BatchArrays PlaceBatch(Device& device, const Shape& shape, const std::vector<Query>& batch) {
  const HostBatch h = Flatten(batch);
  const int64_t n = static_cast<int64_t>(batch.size());
  return {device.Put(h.q),
          device.Put(h.seq),
          device.Put(h.slot),
          device.Put(h.mask),
          device.Put(h.mask_start),
          device.Output<float>(n * shape.width()),
          n};
}

// A CUDA back end whose attention always splits (1), never splits (-1) or chooses (0).
std::unique_ptr<Backend> CudaWithAttentionSplit(int split) {
  CudaBackendOptions options;
  options.attention_split = split;
  return MakeCuda(options);
}

AttentionArgs Args(const BatchArrays& b, const PagedKv& cache, const Shape& shape) {
  AttentionArgs a;
  a.q = b.q;
  a.out = b.out;
  a.cache = cache;
  a.token_seq = b.seq;
  a.slot = b.slot;
  a.tree_mask = b.mask;
  a.mask_start = b.mask_start;
  a.n_tokens = b.n;
  a.n_heads = shape.heads();
  a.n_kv_heads = shape.kv_heads;
  a.head_dim = shape.head_dim;
  a.scale = shape.scale();
  return a;
}

// Overwrites `n` elements at `dst` in back-end memory (synchronizes).
template <typename T>
void Overwrite(Backend& backend, T* dst, const std::vector<T>& host) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
  absl::StatusOr<Buffer> staging = backend.Allocate(bytes, MemoryKind::kStaging, "test refill");
  ASSERT_TRUE(staging.ok()) << staging.status();
  std::memcpy(staging->data(), host.data(), static_cast<size_t>(bytes));
  ASSERT_TRUE(backend.Upload(dst, staging->data(), bytes).ok());
  ASSERT_TRUE(backend.Synchronize().ok());
}

// New contents for a batch's arrays (the same number of tokens).
void Refill(Backend& backend, const BatchArrays& b, const std::vector<Query>& batch) {
  ASSERT_EQ(static_cast<int64_t>(batch.size()), b.n);
  const HostBatch h = Flatten(batch);
  Overwrite(backend, b.q, h.q);
  Overwrite(backend, b.seq, h.seq);
  Overwrite(backend, b.slot, h.slot);
  Overwrite(backend, b.mask, h.mask);
  Overwrite(backend, b.mask_start, h.mask_start);
}

// `batch` attended on `backend` (the op must accept it); the output, after a Synchronize that
// must succeed.
std::vector<float> Attend(Backend& backend, Device& device, const PagedKv& cache,
                          const Shape& shape, const std::vector<Query>& batch) {
  const BatchArrays b = PlaceBatch(device, shape, batch);
  const absl::Status st = backend.Attention(Args(b, cache, shape));
  EXPECT_TRUE(st.ok()) << st;
  return device.Get(b.out, b.n * shape.width());
}

std::vector<float> Row(const std::vector<float>& out, size_t t, int64_t width) {
  return std::vector<float>(out.begin() + static_cast<int64_t>(t) * width,
                            out.begin() + static_cast<int64_t>(t + 1) * width);
}

// Every element of `got` (the outputs of `batch`) within atol + rtol * |want| of the reference.
// Twenty times the f32 error measured on this case (under 3.2e-7, on the CPU back end and in a
// host model of the kernel's rounding steps), and a tenth of what one dropped slot of 1700 moves
// an output by (about 7e-5), so an off-by-one at a chunk or group boundary shows.
::testing::AssertionResult MatchesReference(const PagedCase& c, const std::vector<Query>& batch,
                                            const std::vector<float>& got) {
  constexpr double kAtol = 4e-6, kRtol = 2e-5;
  const Shape& shape = c.shape();
  for (size_t t = 0; t < batch.size(); ++t) {
    for (int64_t h = 0; h < shape.heads(); ++h) {
      const std::vector<double> want = c.Reference(batch[t], h);
      for (int64_t d = 0; d < shape.head_dim; ++d) {
        const double g = got[t * shape.width() + h * shape.head_dim + d];
        if (!(std::fabs(g - want[d]) <= kAtol + kRtol * std::fabs(want[d]))) {
          return ::testing::AssertionFailure()
                 << "token " << t << " (seq " << batch[t].seq << ", slot " << batch[t].slot
                 << ") head " << h << " dim " << d << ": got " << g << ", want " << want[d];
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

class CudaAttentionTest : public CudaTestBase<::testing::TestWithParam<Shape>> {};

TEST_P(CudaAttentionTest, SplitAndSingleBlockFormsGiveTheSameBitsAndMatchTheReference) {
  const Shape& shape = GetParam();
  const PagedCase c(shape, rng_);
  const std::vector<Query>& all = c.queries();
  std::vector<std::vector<float>> results;
  for (const int split : {1, -1}) {
    std::unique_ptr<Backend> backend = CudaWithAttentionSplit(split);
    ASSERT_NE(backend, nullptr);
    Device device(*backend);
    const PagedKv cache = c.Place(device);
    results.push_back(Attend(*backend, device, cache, shape, all));
    // A token alone gives its bits from the batch (the split form's workspace is indexed by the
    // token's place in the batch).
    for (const size_t t : {size_t{0}, size_t{6}, all.size() - 6}) {
      EXPECT_TRUE(SameBits(Attend(*backend, device, cache, shape, {all[t]}),
                           Row(results.back(), t, shape.width())))
          << "token " << t << " alone, split " << split;
    }
    EXPECT_TRUE(device.GuardsIntact()) << "split " << split;
  }
  EXPECT_TRUE(SameBits(results[0], results[1])) << "the split and single-block forms differ";
  EXPECT_TRUE(MatchesReference(c, all, results[0]));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTest,
                         ::testing::Values(Shape{"f32_g4_d64", DType::kF32, 2, 4, 64},
                                           Shape{"bf16_g1_d128", DType::kBF16, 2, 1, 128},
                                           Shape{"bf16_g3_d128", DType::kBF16, 2, 3, 128},
                                           Shape{"bf16_g8_d128", DType::kBF16, 2, 8, 128},
                                           Shape{"f16_g1_d128", DType::kF16, 2, 1, 128},
                                           Shape{"f16_g3_d128", DType::kF16, 2, 3, 128},
                                           Shape{"f16_g8_d128", DType::kF16, 2, 8, 128}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(info.param.name);
                         });

TEST_F(CudaTest, RecordedSplitAttentionReplaysNewSlotsToTheEagerBits) {
  const Shape shape{"bf16_g8_d128", DType::kBF16, 2, 8, 128};
  const PagedCase c(shape, rng_);
  std::unique_ptr<Backend> backend = CudaWithAttentionSplit(1);
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->SupportsRecording());
  Device device(*backend);
  const PagedKv cache = c.Place(device);
  // Two batches of one size: the case's queries, then the same reversed with every plain
  // token's slot halved (new slots, other chunk groups; the tree keeps its slots).
  std::vector<Query> second(c.queries().rbegin(), c.queries().rend());
  for (Query& t : second) {
    if (t.seq != 4) t.mask_start = t.slot = t.slot / 2;
  }
  const std::vector<Query> rounds[2] = {c.queries(), second};
  const BatchArrays b = PlaceBatch(device, shape, rounds[0]);
  const AttentionArgs args = Args(b, cache, shape);
  ASSERT_TRUE(backend->BeginRecording().ok());
  const absl::Status recorded = backend->Attention(args);
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend->EndRecording();
  ASSERT_TRUE(recorded.ok()) << recorded;
  ASSERT_TRUE(work.ok()) << work.status();

  // Replays back to back, with nothing eager between them: a replay that did not reset the
  // arrival counters would have no last block, merge nothing and leave the round before's rows.
  std::vector<std::vector<float>> replayed;
  for (const std::vector<Query>& round : rounds) {
    Refill(*backend, b, round);
    ASSERT_TRUE(backend->Replay(**work).ok());
    replayed.push_back(device.Get(b.out, b.n * shape.width()));
  }
  std::vector<std::vector<float>> eager;
  for (int r = 0; r < 2; ++r) {
    Refill(*backend, b, rounds[r]);
    ASSERT_TRUE(backend->Attention(args).ok());
    eager.push_back(device.Get(b.out, b.n * shape.width()));
    EXPECT_TRUE(SameBits(replayed[r], eager[r])) << "round " << r << ": replay and eager differ";
    EXPECT_TRUE(MatchesReference(c, rounds[r], replayed[r])) << "round " << r;
  }
  EXPECT_FALSE(SameBits(eager[0], eager[1])) << "the rounds must differ for the test to show";
  EXPECT_TRUE(device.GuardsIntact());
}

// A token the kernel must refuse, and what the next Synchronize says.
struct BadToken {
  const char* what;
  Query query;
  int64_t table_block = -1;  // >= 0: cache.block_tables[query.seq][table_block] = table_value
  int32_t table_value = 0;
  std::string
      want;  // cpu_words: the CPU's message for the same call, then "; the kernel skipped it"
};

TEST_F(CudaTest, ABadTokenFailsTheNextSynchronizeAndGetsZerosAlone) {
  const Shape shape{"bf16_g3_d128", DType::kBF16, 2, 3, 128};
  const PagedCase c(shape, rng_);
  // Good neighbours on both sides (sequences 2 and 5, whose tables no case touches).
  const Query before = c.Plain(2, 1024, rng_), after = c.Plain(5, 69, rng_);
  // A token of sequence 4 at slot 1029 whose mask hides slots 992..1007 (block 62) and shows
  // 1008..1029: the CPU checks block 62's entry all the same.
  const uint64_t hides_block_62 = ((uint64_t{1} << 38) - 1) & ~((uint64_t{1} << 16) - 1);
  const std::string table = "Attention: cache.block_tables at index 1 is out of range (value ";
  const std::string slot = "Attention: slot at index 1 is out of range (value ";
  const std::string skipped = "; the kernel skipped it";
  const std::string cpu_words;  // empty: the CPU's words
  const auto q = [&] { return RandomFloats(shape.width(), rng_, -2, 2); };
  const std::vector<BadToken> bad = {
      {.what = "a -1 block-table entry",
       .query = c.Plain(0, 1699, rng_),
       .table_block = 70,
       .table_value = -1,
       .want = table + "-1)" + skipped},
      {.what = "a block-table entry past the cache",
       .query = c.Plain(0, 1699, rng_),
       .table_block = 3,
       .table_value = static_cast<int32_t>(PagedCase::kNumBlocks),
       .want = table + "320)" + skipped},
      {.what = "a -1 entry of a block the tree mask hides",
       .query = {4, 1029, hides_block_62, 1029 - 37, q()},
       .table_block = 62,
       .table_value = -1,
       .want = table + "-1)" + skipped},
      {.what = "a slot beyond the block table",
       .query = c.Plain(1, PagedCase::kMaxBlocks * PagedCase::kBlock, rng_),
       .want = slot + "2048)" + skipped},
      {.what = "a negative slot", .query = c.Plain(1, -1, rng_), .want = slot + "-1)" + skipped},
      {.what = "mask_start 0, far below the slot",
       .query = {0, 1699, ~uint64_t{0}, 0, q()},
       .want = cpu_words},
      {.what = "mask_start above the slot", .query = {0, 1699, 1, 1700, q()}, .want = cpu_words},
      {.what = "mask_start 64 below the slot",
       .query = {0, 1699, ~uint64_t{0}, 1635, q()},
       .want = cpu_words},
      {.what = "a negative mask_start", .query = {1, 10, ~uint64_t{0}, -1, q()}, .want = cpu_words},
      {.what = "the own bit clear, nothing visible", .query = {1, 5, 0, 0, q()}, .want = cpu_words},
      {.what = "the own bit clear in a tree",
       .query = {4, 1025, 0b011111, 1020, q()},
       .want = cpu_words},
  };
  const auto tables_for = [&](const BadToken& b) {
    std::vector<int32_t> t = c.tables();
    if (b.table_block >= 0) t[b.query.seq * PagedCase::kMaxBlocks + b.table_block] = b.table_value;
    return t;
  };

  // The CPU refuses every one of them, and its words are the tree masks' want.
  std::vector<std::string> want;
  {
    absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateCpuBackend(2);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    Device device(**cpu);
    for (const BadToken& b : bad) {
      const std::vector<int32_t> tables = tables_for(b);
      const PagedKv cache = c.Place(device, &tables);
      const absl::Status st = (*cpu)->Attention(
          Args(PlaceBatch(device, shape, {before, b.query, after}), cache, shape));
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << b.what << ": " << st;
      want.push_back(b.want.empty() ? std::string(st.message()) + skipped : b.want);
    }
  }

  for (const int split : {1, -1}) {
    std::unique_ptr<Backend> backend = CudaWithAttentionSplit(split);
    ASSERT_NE(backend, nullptr);
    Device device(*backend);
    const PagedKv good_cache = c.Place(device);
    const std::vector<float> clean = Attend(*backend, device, good_cache, shape, {before, after});
    for (size_t i = 0; i < bad.size(); ++i) {
      const std::vector<int32_t> tables = tables_for(bad[i]);
      const PagedKv cache = c.Place(device, &tables);
      const BatchArrays b = PlaceBatch(device, shape, {before, bad[i].query, after});
      // Device memory: the launch cannot see it, the next Synchronize reports it.
      ASSERT_TRUE(backend->Attention(Args(b, cache, shape)).ok()) << bad[i].what;
      const absl::Status st = backend->Synchronize();
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument)
          << bad[i].what << ", split " << split;
      EXPECT_EQ(st.message(), want[i]) << bad[i].what << ", split " << split;
      const std::vector<float> out = device.Get(b.out, 3 * shape.width());
      EXPECT_TRUE(SameBits(Row(out, 0, shape.width()), Row(clean, 0, shape.width())))
          << bad[i].what << ", split " << split;
      EXPECT_TRUE(SameBits(Row(out, 2, shape.width()), Row(clean, 1, shape.width())))
          << bad[i].what << ", split " << split;
      const std::vector<float> zeros(static_cast<size_t>(shape.width()), 0.0f);
      EXPECT_TRUE(SameBits(Row(out, 1, shape.width()), zeros))
          << bad[i].what << ", split " << split << ": the bad token's heads are not all zeros";
      // The error was reported once: the next pass is clean (Attend's Synchronize must succeed).
      EXPECT_TRUE(SameBits(Attend(*backend, device, good_cache, shape, {before, after}), clean))
          << "after " << bad[i].what << ", split " << split;
    }
    EXPECT_TRUE(device.GuardsIntact()) << "split " << split;
  }
}

// Byte rows of a copy's expected and actual contents, first difference named.
::testing::AssertionResult SameRows(const std::vector<uint8_t>& got,
                                    const std::vector<uint8_t>& want, int64_t row_bytes) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t at = 0; at < got.size(); at += static_cast<size_t>(row_bytes)) {
    if (std::memcmp(&got[at], &want[at], static_cast<size_t>(row_bytes)) != 0) {
      return ::testing::AssertionFailure() << "row " << at / row_bytes << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// `n` (src, dst) row pairs in [0, stride), dst distinct, that chain every way a copy could get
// wrong if it wrote a row before reading every source: a run moving up one row listed upwards
// (each pair's source is the previous pair's destination), a run moving down one row listed
// downwards, swapped neighbours, a block-like copy-on-write, and random pairs around them (any
// source, also a row that is some pair's destination).
std::pair<std::vector<int32_t>, std::vector<int32_t>> ChainedPairs(int64_t n, int64_t stride,
                                                                   std::mt19937& rng) {
  const int32_t q = static_cast<int32_t>(n / 8);
  std::vector<int32_t> src, dst;
  const auto add = [&](int32_t s, int32_t d) {
    src.push_back(s);
    dst.push_back(d);
  };
  std::vector<int32_t> free_rows;
  const auto add_random = [&](int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      add(std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(stride) - 1)(rng),
          free_rows.back());
      free_rows.pop_back();
    }
  };
  const int32_t up = 0, down = q + 8, swaps = 2 * q + 16, cow = 3 * q + 24;
  // Destinations of the random pairs: rows no structured pair writes.
  for (int32_t r = 0; r < stride; ++r) {
    const bool structured = r <= up + q || (r >= down && r < down + q) ||
                            (r >= swaps && r < swaps + q) || (r >= cow && r < cow + q);
    if (!structured) free_rows.push_back(r);
  }
  std::shuffle(free_rows.begin(), free_rows.end(), rng);
  add_random(n / 4);
  for (int32_t i = 0; i < q; ++i) add(up + i, up + i + 1);
  for (int32_t i = q - 1; i >= 0; --i) add(down + i + 1, down + i);
  for (int32_t i = 0; i < q; i += 2) {
    add(swaps + i, swaps + i + 1);
    add(swaps + i + 1, swaps + i);
  }
  for (int32_t i = 0; i < q; ++i) add(static_cast<int32_t>(stride) - q + i, cow + i);
  add_random(n - static_cast<int64_t>(src.size()));
  return {src, dst};
}

TEST_F(CudaTest, CopyKvRowsOverManyColumnTilesMovesRowsAsAHostCopy) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  struct Case {
    DType dtype;
    int64_t n, kv_dim;
  };
  // 4096 rows leave 3 (f32) or 6 (f16) columns per tile: 342 or 171 tiles, the last partial.
  // kMaxCopyKvRows rows fill the 48 KiB of shared memory with one f32 column per tile.
  for (const Case& k : {Case{DType::kF32, 4096, 1024}, Case{DType::kF16, 4096, 1024},
                        Case{DType::kF32, cuda::kMaxCopyKvRows, 256},
                        Case{DType::kF16, cuda::kMaxCopyKvRows, 256}}) {
    const int64_t layers = 2, stride = k.n * 3 / 2;
    const int64_t row_bytes = k.kv_dim * DTypeSize(k.dtype);
    const int64_t bytes = layers * stride * row_bytes;
    const auto [src, dst] = ChainedPairs(k.n, stride, rng_);
    ASSERT_EQ(static_cast<int64_t>(src.size()), k.n);
    std::vector<int32_t> sorted = dst;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    std::vector<uint8_t> before[2];
    for (std::vector<uint8_t>& b : before) {
      std::vector<uint32_t> words(static_cast<size_t>(bytes / 4));
      for (uint32_t& w : words) w = static_cast<uint32_t>(rng_());
      b.resize(static_cast<size_t>(bytes));
      std::memcpy(b.data(), words.data(), b.size());
    }
    Device device(*backend);
    uint8_t* kd = device.Put(before[0]);
    uint8_t* vd = device.Put(before[1]);
    const CopyKvRowsArgs a{
        kd, vd, k.dtype, layers, stride, k.kv_dim, device.Put(src), device.Put(dst), k.n};
    ASSERT_TRUE(backend->CopyKvRows(a).ok());
    const std::vector<uint8_t> got[2] = {device.Get(kd, bytes), device.Get(vd, bytes)};
    for (int tensor = 0; tensor < 2; ++tensor) {
      std::vector<uint8_t> want = before[tensor];
      for (int64_t l = 0; l < layers; ++l) {
        for (int64_t i = 0; i < k.n; ++i) {
          std::memcpy(&want[(l * stride + dst[i]) * row_bytes],
                      &before[tensor][(l * stride + src[i]) * row_bytes],
                      static_cast<size_t>(row_bytes));
        }
      }
      EXPECT_TRUE(SameRows(got[tensor], want, row_bytes))
          << DTypeName(k.dtype) << " n " << k.n << (tensor == 0 ? " k" : " v");
    }
    EXPECT_TRUE(device.GuardsIntact());
  }
  // One row more than a tile's shared memory holds: refused by the launcher.
  Device device(*backend);
  const std::vector<int32_t> rows(cuda::kMaxCopyKvRows + 1, 0);
  const absl::Status st = backend->CopyKvRows(
      {device.Output<uint8_t>(1024), device.Output<uint8_t>(1024), DType::kF32, 1, 256, 1,
       device.Put(rows), device.Put(rows), cuda::kMaxCopyKvRows + 1});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

}  // namespace
}  // namespace specd::kernels
