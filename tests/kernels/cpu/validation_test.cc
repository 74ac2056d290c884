// Bad arguments to every CPU op return INVALID_ARGUMENT naming the op and the field, and never
// touch memory.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace specd::kernels {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

MATCHER_P2(InvalidArgumentNaming, op, field, "") {
  if (arg.code() != absl::StatusCode::kInvalidArgument) {
    *result_listener << "status is " << arg;
    return false;
  }
  const std::string message(arg.message());
  *result_listener << "message: " << message;
  return message.find(op) != std::string::npos && message.find(field) != std::string::npos;
}

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateCpuBackend(2);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  // A valid 2-layer-ish setup: 2 tokens, dim 8, 2 heads of 4, 1 kv head, blocks of 2.
  MatmulArgs GoodMatmul() {
    return {.x = x_.data(), .w = {w_.data(), DType::kF32, 8, 8}, .y = y_.data(), .n_tokens = 2};
  }
  PagedKv GoodCache() {
    return {.k = k_cache_.data(),
            .v = v_cache_.data(),
            .block_tables = tables_.data(),
            .max_blocks = 2,
            .num_blocks = 4,
            .block_size = 2,
            .kv_dim = 4};
  }
  AttentionArgs GoodAttention() {
    return {.q = x_.data(),
            .out = y_.data(),
            .cache = GoodCache(),
            .token_seq = seq_.data(),
            .slot = pos_.data(),
            .n_tokens = 2,
            .n_heads = 2,
            .n_kv_heads = 1,
            .head_dim = 4,
            .scale = 0.5f};
  }
  StoreKvArgs GoodStore() {
    return {.k = x_.data(),
            .v = x_.data(),
            .cache = GoodCache(),
            .token_seq = seq_.data(),
            .slot = pos_.data(),
            .n_tokens = 2};
  }

  std::unique_ptr<Backend> backend_;
  std::vector<float> x_ = std::vector<float>(16, 1.0f);
  std::vector<float> w_ = std::vector<float>(64, 1.0f);
  std::vector<float> y_ = std::vector<float>(16, 0.0f);
  std::vector<float> k_cache_ = std::vector<float>(4 * 2 * 4, 0.0f);  // 4 blocks
  std::vector<float> v_cache_ = std::vector<float>(4 * 2 * 4, 0.0f);
  std::vector<int32_t> tables_ = {0, 1, 2, 3};  // 2 sequences x max_blocks 2
  std::vector<int32_t> seq_ = {0, 1};
  std::vector<int32_t> pos_ = {3, 1};
};

TEST_F(ValidationTest, GoodArgumentsPass) {
  EXPECT_TRUE(backend_->Matmul(GoodMatmul()).ok());
  EXPECT_TRUE(backend_->StoreKv(GoodStore()).ok());
  EXPECT_TRUE(backend_->Attention(GoodAttention()).ok());
}

TEST_F(ValidationTest, Matmul) {
  MatmulArgs a = GoodMatmul();
  a.x = nullptr;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "x"));
  a = GoodMatmul();
  a.w.data = nullptr;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "w.data"));
  a = GoodMatmul();
  a.y = nullptr;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "y"));
  a = GoodMatmul();
  a.w.rows = 0;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "w.rows"));
  a = GoodMatmul();
  a.w.cols = -3;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "w.cols"));
  a = GoodMatmul();
  a.n_tokens = -1;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "n_tokens"));
  a = GoodMatmul();
  a.w.dtype = static_cast<DType>(7);
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "w.dtype"));
  a = GoodMatmul();
  a.y = x_.data();  // in place is not allowed
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "overlap x"));
  a = GoodMatmul();
  a.w.rows = int64_t{1} << 40;
  a.w.cols = int64_t{1} << 40;
  EXPECT_THAT(backend_->Matmul(a), InvalidArgumentNaming("Matmul", "out of range"));
}

TEST_F(ValidationTest, RmsNorm) {
  const RmsNormArgs good{x_.data(), w_.data(), y_.data(), 2, 8, 1e-5f};
  RmsNormArgs a = good;
  a.weight = nullptr;
  EXPECT_THAT(backend_->RmsNorm(a), InvalidArgumentNaming("RmsNorm", "weight"));
  a = good;
  a.dim = 0;
  EXPECT_THAT(backend_->RmsNorm(a), InvalidArgumentNaming("RmsNorm", "dim"));
  a = good;
  a.eps = -1.0f;
  EXPECT_THAT(backend_->RmsNorm(a), InvalidArgumentNaming("RmsNorm", "eps"));
  a = good;
  a.eps = NAN;
  EXPECT_THAT(backend_->RmsNorm(a), InvalidArgumentNaming("RmsNorm", "eps"));
}

TEST_F(ValidationTest, Rope) {
  const float inv_freq[2] = {1.0f, 0.1f};
  const RopeArgs good{y_.data(), pos_.data(), inv_freq, 2, 2, 4};
  EXPECT_TRUE(backend_->Rope(good).ok());
  RopeArgs a = good;
  a.head_dim = 3;
  EXPECT_THAT(backend_->Rope(a), InvalidArgumentNaming("Rope", "head_dim"));
  a = good;
  a.inv_freq = nullptr;
  EXPECT_THAT(backend_->Rope(a), InvalidArgumentNaming("Rope", "inv_freq"));
  a = good;
  a.n_heads = 0;
  EXPECT_THAT(backend_->Rope(a), InvalidArgumentNaming("Rope", "n_heads"));
  const int32_t negative[2] = {0, -4};
  a = good;
  a.pos = negative;
  EXPECT_THAT(backend_->Rope(a), InvalidArgumentNaming("Rope", "pos[1]"));
}

TEST_F(ValidationTest, StoreKv) {
  StoreKvArgs a = GoodStore();
  a.cache.k = nullptr;
  EXPECT_THAT(backend_->StoreKv(a), InvalidArgumentNaming("StoreKv", "cache.k"));
  a = GoodStore();
  a.cache.block_size = 0;
  EXPECT_THAT(backend_->StoreKv(a), InvalidArgumentNaming("StoreKv", "cache.block_size"));
  a = GoodStore();
  const int32_t far[2] = {0, 4};  // block 2 of a 2-block table
  a.slot = far;
  EXPECT_THAT(backend_->StoreKv(a), InvalidArgumentNaming("StoreKv", "slot[1]"));
  a = GoodStore();
  const int32_t bad_seq[2] = {-1, 0};
  a.token_seq = bad_seq;
  EXPECT_THAT(backend_->StoreKv(a), InvalidArgumentNaming("StoreKv", "token_seq[0]"));
  tables_[1] = -1;  // an unassigned block
  EXPECT_THAT(backend_->StoreKv(GoodStore()),
              InvalidArgumentNaming("StoreKv", "cache.block_tables[0][1]"));
  // Nothing was written by the failing calls.
  for (const float f : k_cache_) EXPECT_EQ(f, 0.0f);
}

TEST_F(ValidationTest, Attention) {
  AttentionArgs a = GoodAttention();
  a.n_kv_heads = 3;
  EXPECT_THAT(backend_->Attention(a), InvalidArgumentNaming("Attention", "n_kv_heads"));
  a = GoodAttention();
  a.head_dim = 2;  // kv_dim 4 != 1 x 2
  EXPECT_THAT(backend_->Attention(a), InvalidArgumentNaming("Attention", "cache.kv_dim"));
  a = GoodAttention();
  a.q = nullptr;
  EXPECT_THAT(backend_->Attention(a), InvalidArgumentNaming("Attention", "q"));
  a = GoodAttention();
  a.token_seq = nullptr;
  EXPECT_THAT(backend_->Attention(a), InvalidArgumentNaming("Attention", "token_seq"));
  a = GoodAttention();
  a.scale = INFINITY;
  EXPECT_THAT(backend_->Attention(a), InvalidArgumentNaming("Attention", "scale"));
  a = GoodAttention();
  a.out = x_.data() + 1;  // overlaps q without being q
  EXPECT_THAT(backend_->Attention(a), InvalidArgumentNaming("Attention", "overlap q"));
  tables_[0] = -5;  // a block the prefix of seq 0 needs
  EXPECT_THAT(backend_->Attention(GoodAttention()),
              InvalidArgumentNaming("Attention", "cache.block_tables[0][0]"));
}

TEST_F(ValidationTest, ElementwiseOps) {
  EXPECT_THAT(backend_->SwiGlu({x_.data(), nullptr, y_.data(), 2, 8}),
              InvalidArgumentNaming("SwiGlu", "up"));
  const int32_t ids[2] = {0, 8};
  EXPECT_THAT(backend_->Embedding({{w_.data(), DType::kF32, 8, 8}, ids, y_.data(), 2}),
              InvalidArgumentNaming("Embedding", "ids[1]"));
  EXPECT_THAT(backend_->Embedding({{w_.data(), DType::kBF16, 0, 8}, ids, y_.data(), 2}),
              InvalidArgumentNaming("Embedding", "table.rows"));
}

TEST(CreateCpuBackendTest, ReportsItsThreadsAndIsa) {
  auto backend = CreateCpuBackend(3);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->num_threads(), 3);
  EXPECT_THAT(std::string((*backend)->name()), HasSubstr("cpu-"));
  auto automatic = CreateCpuBackend(0);
  ASSERT_TRUE(automatic.ok());
  EXPECT_GE((*automatic)->num_threads(), 1);
  EXPECT_EQ(CreateCpuBackend(1 << 20).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd::kernels
