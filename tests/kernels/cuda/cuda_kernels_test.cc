// CUDA back end checks beyond the conformance suite (which runs every op on this back end too):
//  * the matmul's tile shapes (tokens per warp 1, 2, 4, 8) give the same bits for every row;
//  * attention gives the same bits with its KV-chunk split and without, over contexts of many
//    chunks and a draft tree, and matches a double-precision reference;
//  * ProcessRows matches the CPU reference: argmax and one-hot rows bit for bit, sampled rows to
//    one unit in the last place with the same kept tokens;
//  * an id out of range in device memory fails the next Synchronize, naming the op, and nothing
//    after it;
//  * recorded work (a CUDA graph) replays with new inputs exactly as eager execution.
// Every test skips, saying why, where no CUDA device is present.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/processed.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/conformance/backend_under_test.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels {
namespace {

using conformance::Device;
using cpu_test::RandomFloats;
using cpu_test::RandomWeight;
using cpu_test::SameBits;
using cpu_test::TestWeight;

std::unique_ptr<Backend> MakeCuda(const CudaBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackendWithOptions(options);
  return b.ok() ? *std::move(b) : nullptr;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackend(0);
    if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status();
  }
  std::mt19937 rng_{7};
};

TEST_F(CudaTest, MatmulTileShapesGiveTheSameBits) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t cols : {5, 64, 700, 3072}) {
      const int64_t rows = 67, n = 19;
      const TestWeight w = RandomWeight(dtype, rows, cols, rng_);
      const std::vector<float> x = RandomFloats(n * cols, rng_);
      std::vector<float> first;
      for (const int tw : {1, 2, 4, 8}) {
        CudaBackendOptions options;
        options.matmul_tokens_per_warp = tw;
        std::unique_ptr<Backend> backend = MakeCuda(options);
        ASSERT_NE(backend, nullptr);
        Device device(*backend);
        float* y = device.Output<float>(n * rows);
        ASSERT_TRUE(
            backend->Matmul({device.Put(x), {device.Put(w.bytes), dtype, rows, cols}, y, n}).ok());
        const std::vector<float> got = device.Get(y, n * rows);
        if (first.empty()) first = got;
        EXPECT_TRUE(SameBits(got, first))
            << DTypeName(dtype) << " cols " << cols << " tokens per warp " << tw;
        // And a row fed alone gives that row's bits.
        const std::vector<float> one(x.begin() + 11 * cols, x.begin() + 12 * cols);
        float* y1 = device.Output<float>(rows);
        ASSERT_TRUE(
            backend->Matmul({device.Put(one), {device.Put(w.bytes), dtype, rows, cols}, y1, 1})
                .ok());
        EXPECT_TRUE(SameBits(device.Get(y1, rows), std::vector<float>(first.begin() + 11 * rows,
                                                                      first.begin() + 12 * rows)));
        EXPECT_TRUE(device.GuardsIntact());
      }
    }
  }
}

// Three long sequences (many 64-slot chunks) and a draft tree, in a shuffled paged cache.
struct AttentionCase {
  static constexpr int64_t kHeads = 8, kKvHeads = 2, kHeadDim = 64, kBlock = 16;
  static constexpr int64_t kKvDim = kKvHeads * kHeadDim, kWidth = kHeads * kHeadDim;
  std::vector<int64_t> lens = {300, 1000, 70, 140};
  int64_t max_blocks = 64, num_blocks = 0;
  std::vector<int32_t> tables;
  std::vector<float> k, v;  // f32 cache contents
  std::vector<int32_t> seq, slot, mask_start;
  std::vector<uint64_t> mask;
  std::vector<float> q;

  explicit AttentionCase(std::mt19937& rng) {
    num_blocks = 4 * max_blocks;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.assign(static_cast<size_t>(4 * max_blocks), -1);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t b = 0; b * kBlock < lens[s]; ++b) tables[s * max_blocks + b] = ids[next++];
    }
    k = RandomFloats(num_blocks * kBlock * kKvDim, rng, -2, 2);
    v = RandomFloats(num_blocks * kBlock * kKvDim, rng, -2, 2);
    // Decode tokens, the last 5 of a sequence (a verify), and 6 tree nodes after slot 128.
    for (const auto& [s, p] : std::vector<std::pair<int, int>>{
             {0, 299}, {1, 999}, {1, 995}, {1, 996}, {1, 997}, {1, 998}, {2, 69}, {2, 0}}) {
      seq.push_back(s), slot.push_back(p), mask.push_back(1), mask_start.push_back(p);
    }
    const uint64_t tree[6] = {0b000001, 0b000011, 0b000101, 0b001011, 0b010101, 0b110101};
    for (int j = 0; j < 6; ++j) {
      seq.push_back(3), slot.push_back(128 + j), mask.push_back(tree[j]), mask_start.push_back(128);
    }
    q = RandomFloats(static_cast<int64_t>(seq.size()) * kWidth, rng);
  }

  double Reference(size_t t, int64_t h, int64_t d) const {
    const int64_t kvh = h / (kHeads / kKvHeads);
    std::vector<double> w;
    std::vector<int64_t> rows;
    for (int64_t s = 0; s <= slot[t]; ++s) {
      if (s >= mask_start[t] && ((mask[t] >> (s - mask_start[t])) & 1) == 0) continue;
      const int64_t row = tables[seq[t] * max_blocks + s / kBlock] * kBlock + s % kBlock;
      double dot = 0;
      for (int64_t i = 0; i < kHeadDim; ++i) {
        dot += static_cast<double>(q[t * kWidth + h * kHeadDim + i]) *
               k[row * kKvDim + kvh * kHeadDim + i];
      }
      w.push_back(dot / std::sqrt(static_cast<double>(kHeadDim)));
      rows.push_back(row);
    }
    const double m = *std::max_element(w.begin(), w.end());
    double sum = 0, acc = 0;
    for (size_t j = 0; j < w.size(); ++j) {
      const double e = std::exp(w[j] - m);
      sum += e;
      acc += e * v[rows[j] * kKvDim + kvh * kHeadDim + d];
    }
    return acc / sum;
  }
};

std::vector<float> RunAttention(Backend& backend, const AttentionCase& c,
                                const std::vector<int>& order) {
  Device device(backend);
  std::vector<int32_t> seq, slot, start;
  std::vector<uint64_t> mask;
  std::vector<float> q;
  for (const int t : order) {
    seq.push_back(c.seq[t]), slot.push_back(c.slot[t]), start.push_back(c.mask_start[t]);
    mask.push_back(c.mask[t]);
    q.insert(q.end(), c.q.begin() + t * c.kWidth, c.q.begin() + (t + 1) * c.kWidth);
  }
  const int64_t n = static_cast<int64_t>(order.size());
  AttentionArgs a;
  a.q = device.Put(q);
  a.out = device.Output<float>(n * c.kWidth);
  a.cache = {device.Put(c.k), device.Put(c.v), DType::kF32, device.Put(c.tables),
             c.max_blocks,    c.num_blocks,    c.kBlock,    c.kKvDim};
  a.token_seq = device.Put(seq);
  a.slot = device.Put(slot);
  a.tree_mask = device.Put(mask);
  a.mask_start = device.Put(start);
  a.n_tokens = n;
  a.n_heads = c.kHeads;
  a.n_kv_heads = c.kKvHeads;
  a.head_dim = c.kHeadDim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.kHeadDim));
  EXPECT_TRUE(backend.Attention(a).ok());
  std::vector<float> out = device.Get(a.out, n * c.kWidth);
  EXPECT_TRUE(device.GuardsIntact());
  return out;
}

TEST_F(CudaTest, AttentionSplitAndSequentialGiveTheSameBitsOverManyChunks) {
  const AttentionCase c(rng_);
  std::vector<int> all(c.seq.size());
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<float>> results;
  for (const int split : {1, -1}) {
    CudaBackendOptions options;
    options.attention_split = split;
    std::unique_ptr<Backend> backend = MakeCuda(options);
    ASSERT_NE(backend, nullptr);
    results.push_back(RunAttention(*backend, c, all));
    // Each token alone gives its bits from the batch.
    for (const int t : {0, 3, 9}) {
      const std::vector<float> alone = RunAttention(*backend, c, {t});
      EXPECT_TRUE(SameBits(alone, std::vector<float>(results.back().begin() + t * c.kWidth,
                                                     results.back().begin() + (t + 1) * c.kWidth)))
          << "token " << t << " split " << split;
    }
  }
  EXPECT_TRUE(SameBits(results[0], results[1])) << "split and sequential forms differ";
  for (size_t t = 0; t < c.seq.size(); ++t) {
    for (int64_t h = 0; h < c.kHeads; ++h) {
      for (int64_t d = 0; d < c.kHeadDim; d += 7) {
        const double want = c.Reference(t, h, d);
        ASSERT_NEAR(results[0][t * c.kWidth + h * c.kHeadDim + d], want,
                    2e-5 + 1e-4 * std::fabs(want))
            << "token " << t << " head " << h << " dim " << d;
      }
    }
  }
}

TEST_F(CudaTest, ProcessRowsMatchesTheCpuToTheLastBitButOne) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  Device device(*backend);
  const int64_t vocab = 32000;
  struct Case {
    float temperature, top_p, min_p;
    int32_t top_k;
    RowMode mode;
  };
  const std::vector<Case> cases = {{1.0f, 1.0f, 0.0f, 0, RowMode::kSample},
                                   {0.7f, 0.9f, 0.0f, 0, RowMode::kSample},
                                   {1.3f, 0.95f, 0.05f, 50, RowMode::kSample},
                                   {0.8f, 1.0f, 0.1f, 0, RowMode::kSample},
                                   {1.0f, 0.8f, 0.0f, 0, RowMode::kArgmaxOfProcessed},
                                   {0.0f, 1.0f, 0.0f, 0, RowMode::kGreedy}};
  const int64_t n = static_cast<int64_t>(cases.size());
  // Logits with an LLM-like spread, quantised so that ties occur.
  std::vector<float> logits = RandomFloats(n * vocab, rng_, -12, 12);
  for (float& x : logits) x = std::round(x * 64.0f) / 64.0f;
  std::vector<RowSampling> rows(cases.size());
  for (size_t r = 0; r < cases.size(); ++r) {
    rows[r].params.temperature = cases[r].temperature;
    rows[r].params.top_p = cases[r].top_p;
    rows[r].params.min_p = cases[r].min_p;
    rows[r].params.top_k = cases[r].top_k;
    rows[r].mode = cases[r].mode;
    rows[r].prob_slot = static_cast<int32_t>(r);
  }
  const std::vector<int32_t> history = {0};
  ProcessRowsArgs a;
  a.logits = device.Put(logits);
  a.n_rows = n;
  a.vocab = vocab;
  a.rows = device.Put(rows);
  a.history = device.Put(history);
  a.history_len = 1;
  a.probs = device.Output<float>(n * vocab);
  a.prob_capacity = n;
  a.argmax = device.Output<int32_t>(n);
  a.error = device.Output<int32_t>(n);
  ASSERT_TRUE(backend->ProcessRows(a).ok());
  const std::vector<float> probs = device.Get(a.probs, n * vocab);
  const std::vector<int32_t> argmax = device.Get(a.argmax, n);
  for (size_t r = 0; r < cases.size(); ++r) {
    const std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
    std::vector<float> want(static_cast<size_t>(vocab));
    ASSERT_TRUE(cpu::ProcessedDistribution(row, rows[r].params, {}, want).ok());
    int32_t want_argmax = *cpu::GreedyToken(row, rows[r].params, {});
    if (cases[r].mode == RowMode::kArgmaxOfProcessed) {
      want_argmax = cpu::ArgMaxLowestId(want);
      std::fill(want.begin(), want.end(), 0.0f);
      want[static_cast<size_t>(want_argmax)] = 1.0f;
    }
    EXPECT_EQ(argmax[r], want_argmax) << "row " << r;
    const std::vector<float> got(probs.begin() + r * vocab, probs.begin() + (r + 1) * vocab);
    if (cases[r].mode != RowMode::kSample) {
      EXPECT_TRUE(SameBits(got, want)) << "row " << r;
      continue;
    }
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0f) << "row " << r << " token " << i << " kept";
      ASSERT_LE(std::fabs(got[i] - want[i]), std::ldexp(std::fabs(want[i]), -22))
          << "row " << r << " token " << i;
    }
  }
}

TEST_F(CudaTest, AnIdOutOfRangeFailsTheNextSynchronizeOnly) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  Device device(*backend);
  const TestWeight table = RandomWeight(DType::kF32, 10, 8, rng_);
  const std::vector<int32_t> ids = {3, 10};
  float* out = device.Output<float>(16);
  ASSERT_TRUE(
      backend->Embedding({{device.Put(table.bytes), DType::kF32, 10, 8}, device.Put(ids), out, 2})
          .ok());
  const absl::Status st = backend->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Embedding: ids at index 1"), std::string::npos) << st;
  EXPECT_TRUE(backend->Synchronize().ok());
  const std::vector<float> got = device.Get(out, 16);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], table.values[3 * 8 + i]);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(got[i], 0.0f);
}

TEST_F(CudaTest, RecordedWorkReplaysWithNewInputs) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->SupportsRecording());
  Device device(*backend);
  const int64_t rows = 48, cols = 256, n = 3;
  const TestWeight w = RandomWeight(DType::kBF16, rows, cols, rng_);
  const WeightView view{device.Put(w.bytes), DType::kBF16, rows, cols};
  float* x = device.Put(RandomFloats(n * cols, rng_));
  float* y = device.Output<float>(n * rows);
  ASSERT_TRUE(backend->BeginRecording().ok());
  ASSERT_TRUE(backend->Matmul({x, view, y, n}).ok());
  ASSERT_TRUE(backend->Add({y, y + rows, 1, rows}).ok());
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend->EndRecording();
  ASSERT_TRUE(work.ok()) << work.status();
  for (int round = 0; round < 2; ++round) {
    const std::vector<float> input = RandomFloats(n * cols, rng_);
    Buffer staging = *backend->Allocate(n * cols * 4, MemoryKind::kStaging, "test");
    std::memcpy(staging.data(), input.data(), input.size() * 4);
    ASSERT_TRUE(backend->Upload(x, staging.data(), n * cols * 4).ok());
    ASSERT_TRUE(backend->Replay(**work).ok());
    const std::vector<float> replayed = device.Get(y, n * rows);
    ASSERT_TRUE(backend->Matmul({x, view, y, n}).ok());
    ASSERT_TRUE(backend->Add({y, y + rows, 1, rows}).ok());
    EXPECT_TRUE(SameBits(replayed, device.Get(y, n * rows))) << "round " << round;
  }
}

}  // namespace
}  // namespace specd::kernels
