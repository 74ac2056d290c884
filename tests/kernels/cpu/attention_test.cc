// StoreKv and paged grouped-query Attention of the CPU back end against a double-precision
// reference, out-of-bounds checks on the cache, and batch invariance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels {
namespace {

using cpu::CpuIsa;
using cpu_test::AllClose;
using cpu_test::GuardedBuffer;
using cpu_test::RandomFloats;
using cpu_test::SameBits;

struct AttnCase {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int threads;
  CpuIsa isa;

  std::string ToString() const {
    return absl::StrCat("h", n_heads, "_kv", n_kv_heads, "_d", head_dim, "_bs", block_size, "_th",
                        threads, "_", cpu::CpuIsaName(isa));
  }
};

// Three sequences in a shuffled paged cache; the batch asks for the last tokens of each, as a
// decode step (1 token), a catch-up (4 tokens) and a K+1 = 5 verification.
class PagedFixture {
 public:
  static constexpr int64_t kSeqLens[3] = {1, 9, 23};

  PagedFixture(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size,
               std::mt19937& rng)
      : n_heads_(n_heads), n_kv_heads_(n_kv_heads), head_dim_(head_dim), block_size_(block_size) {
    kv_dim_ = n_kv_heads * head_dim;
    max_blocks_ = (kSeqLens[2] + block_size - 1) / block_size + 1;
    num_blocks_ = 3 * max_blocks_;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks_));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_tables_.assign(static_cast<size_t>(3 * max_blocks_), -1);
    size_t next = 0;
    for (int s = 0; s < 3; ++s) {
      for (int64_t b = 0; b * block_size < kSeqLens[s]; ++b) {
        block_tables_[s * max_blocks_ + b] = ids[next++];
      }
      k_[s] = RandomFloats(kSeqLens[s] * kv_dim_, rng);
      v_[s] = RandomFloats(kSeqLens[s] * kv_dim_, rng);
    }
    k_cache_ = std::make_unique<GuardedBuffer>(num_blocks_ * block_size * kv_dim_);
    v_cache_ = std::make_unique<GuardedBuffer>(num_blocks_ * block_size * kv_dim_);
    const int64_t first[3] = {0, 5, 18};
    for (int s = 0; s < 3; ++s) {
      for (int64_t p = first[s]; p < kSeqLens[s]; ++p) {
        token_seq_.push_back(s);
        pos_.push_back(static_cast<int32_t>(p));
      }
    }
    q_ = RandomFloats(n_tokens() * n_heads * head_dim, rng);
  }

  PagedKv cache() {
    return {.k = k_cache_->data(),
            .v = v_cache_->data(),
            .block_tables = block_tables_.data(),
            .max_blocks = max_blocks_,
            .num_blocks = num_blocks_,
            .block_size = block_size_,
            .kv_dim = kv_dim_};
  }

  // Stores every position of every sequence, in a shuffled order and uneven batches.
  void StoreAll(Backend& backend, std::mt19937& rng) {
    std::vector<std::pair<int32_t, int32_t>> slots;
    for (int s = 0; s < 3; ++s) {
      for (int32_t p = 0; p < kSeqLens[s]; ++p) slots.emplace_back(s, p);
    }
    std::shuffle(slots.begin(), slots.end(), rng);
    for (size_t begin = 0; begin < slots.size(); begin += 7) {
      const size_t end = std::min(slots.size(), begin + 7);
      std::vector<float> k, v;
      std::vector<int32_t> seq, pos;
      for (size_t i = begin; i < end; ++i) {
        const auto [s, p] = slots[i];
        k.insert(k.end(), k_[s].begin() + p * kv_dim_, k_[s].begin() + (p + 1) * kv_dim_);
        v.insert(v.end(), v_[s].begin() + p * kv_dim_, v_[s].begin() + (p + 1) * kv_dim_);
        seq.push_back(s);
        pos.push_back(p);
      }
      const absl::Status status = backend.StoreKv({.k = k.data(),
                                                   .v = v.data(),
                                                   .cache = cache(),
                                                   .token_seq = seq.data(),
                                                   .slot = pos.data(),
                                                   .n_tokens = static_cast<int64_t>(seq.size())});
      ASSERT_TRUE(status.ok()) << status;
    }
  }

  // Attention for tokens [begin, begin + n) of the batch; returns their outputs.
  std::vector<float> Attend(Backend& backend, int64_t begin, int64_t n, bool in_place = false) {
    const int64_t width = n_heads_ * head_dim_;
    std::vector<float> q(q_.begin() + begin * width, q_.begin() + (begin + n) * width);
    GuardedBuffer out(n * width, in_place ? q : std::vector<float>(q.size()));
    const absl::Status status = backend.Attention({.q = in_place ? out.data() : q.data(),
                                                   .out = out.data(),
                                                   .cache = cache(),
                                                   .token_seq = token_seq_.data() + begin,
                                                   .slot = pos_.data() + begin,
                                                   .n_tokens = n,
                                                   .n_heads = n_heads_,
                                                   .n_kv_heads = n_kv_heads_,
                                                   .head_dim = head_dim_,
                                                   .scale = scale()});
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(out.GuardsIntact());
    return out.payload();
  }

  std::vector<double> Reference() const {
    const int64_t width = n_heads_ * head_dim_;
    std::vector<double> out(static_cast<size_t>(n_tokens() * width));
    for (int64_t t = 0; t < n_tokens(); ++t) {
      const int s = token_seq_[t];
      const int64_t n_pos = pos_[t] + 1;
      for (int64_t h = 0; h < n_heads_; ++h) {
        const int64_t kvh = h / (n_heads_ / n_kv_heads_);
        std::vector<double> w(static_cast<size_t>(n_pos));
        double max_s = -INFINITY;
        for (int64_t p = 0; p < n_pos; ++p) {
          double dot = 0.0;
          for (int64_t d = 0; d < head_dim_; ++d) {
            dot += static_cast<double>(q_[t * width + h * head_dim_ + d]) *
                   k_[s][p * kv_dim_ + kvh * head_dim_ + d];
          }
          w[p] = dot * scale();
          max_s = std::max(max_s, w[p]);
        }
        double sum = 0.0;
        for (double& x : w) sum += (x = std::exp(x - max_s));
        for (int64_t d = 0; d < head_dim_; ++d) {
          double acc = 0.0;
          for (int64_t p = 0; p < n_pos; ++p)
            acc += w[p] * v_[s][p * kv_dim_ + kvh * head_dim_ + d];
          out[t * width + h * head_dim_ + d] = acc / sum;
        }
      }
    }
    return out;
  }

  // Every stored slot holds its row exactly; every other slot still holds the sentinel.
  ::testing::AssertionResult CacheHoldsExactlyTheStoredRows() const {
    std::vector<bool> written(static_cast<size_t>(num_blocks_ * block_size_), false);
    for (int s = 0; s < 3; ++s) {
      for (int64_t p = 0; p < kSeqLens[s]; ++p) {
        const int64_t slot =
            block_tables_[s * max_blocks_ + p / block_size_] * block_size_ + p % block_size_;
        written[slot] = true;
        if (std::memcmp(k_cache_->data() + slot * kv_dim_, k_[s].data() + p * kv_dim_,
                        kv_dim_ * 4) != 0 ||
            std::memcmp(v_cache_->data() + slot * kv_dim_, v_[s].data() + p * kv_dim_,
                        kv_dim_ * 4) != 0) {
          return ::testing::AssertionFailure() << "seq " << s << " pos " << p << " not stored";
        }
      }
    }
    for (int64_t slot = 0; slot < num_blocks_ * block_size_; ++slot) {
      if (written[slot]) continue;
      for (int64_t d = 0; d < kv_dim_; ++d) {
        uint32_t bits;
        std::memcpy(&bits, k_cache_->data() + slot * kv_dim_ + d, 4);
        if (bits != GuardedBuffer::kSentinelBits) {
          return ::testing::AssertionFailure() << "slot " << slot << " was written";
        }
      }
    }
    if (auto r = k_cache_->GuardsIntact(); !r) return r;
    return v_cache_->GuardsIntact();
  }

  int64_t n_tokens() const { return static_cast<int64_t>(pos_.size()); }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim_)); }
  void ScaleQueries(float f) {
    for (float& x : q_) x *= f;
  }

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_, block_size_;
  int64_t kv_dim_ = 0, max_blocks_ = 0, num_blocks_ = 0;
  std::vector<int32_t> block_tables_;
  std::vector<float> k_[3], v_[3];
  std::unique_ptr<GuardedBuffer> k_cache_, v_cache_;
  std::vector<int32_t> token_seq_, pos_;
  std::vector<float> q_;
};

void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.ToString(); }

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, StoresAndAttendsLikeTheReference) {
  const AttnCase& c = GetParam();
  if (!cpu::CpuIsaSupported(c.isa)) GTEST_SKIP() << "this CPU cannot run " << c.ToString();
  std::mt19937 rng(static_cast<uint32_t>(c.n_heads * 1000 + c.head_dim * 10 + c.block_size));
  PagedFixture f(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, rng);
  auto backend = CreateCpuBackendWithIsa(c.threads, c.isa);
  ASSERT_TRUE(backend.ok()) << backend.status();
  f.StoreAll(**backend, rng);
  EXPECT_TRUE(f.CacheHoldsExactlyTheStoredRows());
  const std::vector<float> out = f.Attend(**backend, 0, f.n_tokens());
  EXPECT_TRUE(AllClose(out.data(), f.Reference(), {1e-5}, 1e-4));
}

std::vector<AttnCase> AttnCases() {
  struct Heads {
    int64_t n_heads, n_kv_heads, head_dim;
  };
  const Heads heads[] = {{4, 4, 16}, {8, 2, 64}, {6, 3, 20}, {2, 1, 128}, {12, 12, 64}};
  std::vector<AttnCase> cases;
  for (const CpuIsa isa : cpu_test::AllIsas()) {
    for (const Heads& h : heads) {
      for (const int64_t block_size : {1, 4, 16}) {
        for (const int threads : {1, 3}) {
          cases.push_back({h.n_heads, h.n_kv_heads, h.head_dim, block_size, threads, isa});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Configs, AttentionTest, ::testing::ValuesIn(AttnCases()),
                         [](const auto& info) { return info.param.ToString(); });

TEST(AttentionInvarianceTest, BitIdenticalAcrossBatchingThreadsAndIsas) {
  std::mt19937 rng(99);
  PagedFixture f(8, 2, 64, 4, rng);
  auto base = CreateCpuBackendWithIsa(1, cpu::BestCpuIsa());
  ASSERT_TRUE(base.ok()) << base.status();
  f.StoreAll(**base, rng);
  const std::vector<float> all_at_once = f.Attend(**base, 0, f.n_tokens());

  auto two = CreateCpuBackendWithIsa(2, cpu::BestCpuIsa());
  ASSERT_TRUE(two.ok());
  std::vector<float> one_by_one;
  for (int64_t t = 0; t < f.n_tokens(); ++t) {
    const std::vector<float> row = f.Attend(**two, t, 1);
    one_by_one.insert(one_by_one.end(), row.begin(), row.end());
  }
  EXPECT_TRUE(SameBits(one_by_one, all_at_once)) << "one token at a time differs";

  auto three = CreateCpuBackendWithIsa(3, cpu::BestCpuIsa());
  ASSERT_TRUE(three.ok());
  EXPECT_TRUE(SameBits(f.Attend(**three, 0, f.n_tokens()), all_at_once)) << "3 threads differ";
  EXPECT_TRUE(SameBits(f.Attend(**three, 0, f.n_tokens(), /*in_place=*/true), all_at_once))
      << "out == q differs";
  for (const CpuIsa isa : cpu_test::SupportedIsas()) {
    auto backend = CreateCpuBackendWithIsa(2, isa);
    ASSERT_TRUE(backend.ok());
    EXPECT_TRUE(SameBits(f.Attend(**backend, 0, f.n_tokens()), all_at_once))
        << cpu::CpuIsaName(isa) << " differs";
  }
}

// Scores far beyond exp's range stay finite thanks to the max subtraction.
TEST(AttentionTest, LargeScoresStayFinite) {
  std::mt19937 rng(5);
  PagedFixture f(4, 2, 32, 8, rng);
  f.ScaleQueries(2000.0f);
  auto backend = CreateCpuBackendWithIsa(2, cpu::BestCpuIsa());
  ASSERT_TRUE(backend.ok());
  f.StoreAll(**backend, rng);
  const std::vector<float> out = f.Attend(**backend, 0, f.n_tokens());
  EXPECT_TRUE(AllClose(out.data(), f.Reference(), {1e-3}, 1e-3));
}

}  // namespace
}  // namespace specd::kernels
