// The back-end-neutral argument checks (kernels/validate.h) on their own, so what every back end
// returns for a bad call is pinned down without one: the exact INVALID_ARGUMENT messages (written
// out here by hand), which check wins when several fail, that good arguments pass, and that an
// empty call passes without looking at its pointers. None of the Validate*Args functions reads
// memory through the pointers it is given, so fake addresses serve where no overlap is at stake.
#include "kernels/validate.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace specd::kernels {
namespace {

MATCHER_P(InvalidArgument, message, "") {
  if (arg.code() != absl::StatusCode::kInvalidArgument) {
    *result_listener << "status is " << arg;
    return false;
  }
  *result_listener << "message: " << arg.message();
  return arg.message() == message;
}

// Distinct, far-apart addresses that are never dereferenced.
template <typename T>
T* Fake(uintptr_t i) {
  return reinterpret_cast<T*>(uintptr_t{1} << 40 | i << 32);
}

TEST(CheckHelpersTest, MessagesNameTheOpTheFieldAndTheValue) {
  EXPECT_TRUE(CheckNotNull("Op", "x", Fake<float>(1)).ok());
  EXPECT_THAT(CheckNotNull("Op", "x", nullptr), InvalidArgument("Op: x must not be null"));
  EXPECT_TRUE(CheckPositive("Op", "dim", 1).ok());
  EXPECT_THAT(CheckPositive("Op", "dim", 0), InvalidArgument("Op: dim must be > 0, got 0"));
  EXPECT_TRUE(CheckNonNegative("Op", "n", 0).ok());
  EXPECT_THAT(CheckNonNegative("Op", "n", -2), InvalidArgument("Op: n must be >= 0, got -2"));
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_TRUE(CheckDType("Op", "w.dtype", dtype).ok());
  }
  EXPECT_THAT(CheckDType("Op", "w.dtype", static_cast<DType>(9)),
              InvalidArgument("Op: w.dtype has unknown dtype value 9"));
}

TEST(CheckHelpersTest, ElementCountStopsAtTwoToThe48) {
  const int64_t k24 = int64_t{1} << 24;
  EXPECT_TRUE(CheckElementCount("Op", "a x b", k24, k24).ok());
  EXPECT_TRUE(CheckElementCount("Op", "a x b", 0, int64_t{1} << 62).ok());
  EXPECT_THAT(CheckElementCount("Op", "a x b", k24, k24 + 1),
              InvalidArgument("Op: a x b = 16777216 x 16777217 elements is out of range"));
  EXPECT_THAT(CheckElementCount("Op", "a x b", -1, 4),
              InvalidArgument("Op: a x b = -1 x 4 elements is out of range"));
}

TEST(CheckHelpersTest, OverlapIsAnySharedByte) {
  char bytes[16] = {};
  EXPECT_TRUE(CheckNoOverlap("Op", "y", bytes, 8, "x", bytes + 8, 8).ok());
  EXPECT_TRUE(CheckNoOverlap("Op", "y", bytes + 8, 8, "x", bytes, 8).ok());
  EXPECT_THAT(CheckNoOverlap("Op", "y", bytes, 9, "x", bytes + 8, 8),
              InvalidArgument("Op: y must not overlap x"));
  EXPECT_THAT(CheckNoOverlap("Op", "y", bytes + 8, 8, "x", bytes, 9),
              InvalidArgument("Op: y must not overlap x"));
}

// Two sequences of up to 2 blocks of 2 slots, in a cache of 4 blocks.
PagedKv GoodCache(const int32_t* tables) {
  return {.k = Fake<void>(1),
          .v = Fake<void>(2),
          .dtype = DType::kBF16,
          .block_tables = tables,
          .max_blocks = 2,
          .num_blocks = 4,
          .block_size = 2,
          .kv_dim = 4};
}

TEST(CheckHelpersTest, PagedKvNamesTheCacheField) {
  const int32_t tables[4] = {0, 1, 2, 3};
  EXPECT_TRUE(CheckPagedKv("Op", GoodCache(tables)).ok());
  PagedKv c = GoodCache(tables);
  c.v = nullptr;
  EXPECT_THAT(CheckPagedKv("Op", c), InvalidArgument("Op: cache.v must not be null"));
  c = GoodCache(tables);
  c.dtype = static_cast<DType>(5);
  EXPECT_THAT(CheckPagedKv("Op", c), InvalidArgument("Op: cache.dtype has unknown dtype value 5"));
  c = GoodCache(tables);
  c.block_tables = nullptr;
  EXPECT_THAT(CheckPagedKv("Op", c), InvalidArgument("Op: cache.block_tables must not be null"));
  c = GoodCache(tables);
  c.num_blocks = 0;
  EXPECT_THAT(CheckPagedKv("Op", c), InvalidArgument("Op: cache.num_blocks must be > 0, got 0"));
  c = GoodCache(tables);
  c.block_size = int64_t{1} << 30;
  c.kv_dim = int64_t{1} << 20;
  EXPECT_THAT(CheckPagedKv("Op", c),
              InvalidArgument("Op: cache.block_size x cache.kv_dim = 1073741824 x 1048576 "
                              "elements is out of range"));
  c = GoodCache(tables);
  c.num_blocks = int64_t{1} << 46;
  EXPECT_THAT(CheckPagedKv("Op", c),
              InvalidArgument("Op: cache.num_blocks x cache.block_size x cache.kv_dim = "
                              "70368744177664 x 8 elements is out of range"));
}

TEST(CheckHelpersTest, TokenInCacheChecksTheSlotsBlockOrTheWholePrefix) {
  int32_t tables[4] = {0, 1, 2, 3};
  const PagedKv cache = GoodCache(tables);
  const int32_t seq[3] = {0, 1, -1};
  const int32_t slot[3] = {3, 4, 0};
  EXPECT_TRUE(CheckTokenInCache("Op", cache, seq, slot, 0, /*whole_prefix=*/true).ok());
  EXPECT_THAT(CheckTokenInCache("Op", cache, seq, slot, 1, false),
              InvalidArgument("Op: slot[1] = 4 needs block 2 but cache.max_blocks is 2 "
                              "(cache.block_size 2)"));
  EXPECT_THAT(CheckTokenInCache("Op", cache, seq, slot, 2, false),
              InvalidArgument("Op: token_seq[2] must be >= 0, got -1"));
  const int32_t negative_slot[1] = {-3};
  EXPECT_THAT(CheckTokenInCache("Op", cache, seq, negative_slot, 0, false),
              InvalidArgument("Op: slot[0] must be >= 0, got -3"));
  // Block 0 of sequence 0 is not a block of the cache: only a whole-prefix check sees it.
  tables[0] = 4;
  EXPECT_TRUE(CheckTokenInCache("Op", cache, seq, slot, 0, /*whole_prefix=*/false).ok());
  EXPECT_THAT(CheckTokenInCache("Op", cache, seq, slot, 0, /*whole_prefix=*/true),
              InvalidArgument("Op: cache.block_tables[0][0] = 4 is not a block of the cache "
                              "(4 blocks; slot[0] = 3)"));
}

TEST(ValidateArgsTest, Matmul) {
  float x[16] = {};
  float y[16] = {};
  const MatmulArgs good{.x = x, .w = {Fake<void>(1), DType::kBF16, 4, 4}, .y = y, .n_tokens = 4};
  EXPECT_TRUE(ValidateMatmulArgs(good).ok());
  EXPECT_TRUE(ValidateMatmulArgs({.w = {nullptr, DType::kF32, 4, 4}, .n_tokens = 0}).ok());
  MatmulArgs a = good;
  a.w.dtype = static_cast<DType>(3);
  EXPECT_THAT(ValidateMatmulArgs(a), InvalidArgument("Matmul: w.dtype has unknown dtype value 3"));
  a = good;
  a.w.cols = 0;
  a.n_tokens = -1;  // the weight's shape is checked first
  EXPECT_THAT(ValidateMatmulArgs(a), InvalidArgument("Matmul: w.cols must be > 0, got 0"));
  a = good;
  a.n_tokens = int64_t{1} << 47;
  EXPECT_THAT(ValidateMatmulArgs(a),
              InvalidArgument("Matmul: n_tokens x w.cols = 140737488355328 x 4 elements is out "
                              "of range"));
  a = good;
  a.w.data = nullptr;
  EXPECT_THAT(ValidateMatmulArgs(a), InvalidArgument("Matmul: w.data must not be null"));
  a = good;
  a.y = x;
  EXPECT_THAT(ValidateMatmulArgs(a), InvalidArgument("Matmul: y must not overlap x"));
  a = good;
  a.w.data = y + 15;
  EXPECT_THAT(ValidateMatmulArgs(a), InvalidArgument("Matmul: y must not overlap w.data"));
}

TEST(ValidateArgsTest, MatmulGroup) {
  const float* x = Fake<float>(1);
  float y0[16] = {}, y1[8] = {};
  MatmulGroupArgs g;
  g.n_parts = 2;
  g.parts[0] = {.x = x, .w = {Fake<void>(2), DType::kBF16, 4, 4}, .y = y0, .n_tokens = 4};
  g.parts[1] = {.x = x, .w = {Fake<void>(3), DType::kBF16, 2, 4}, .y = y1, .n_tokens = 4};
  EXPECT_TRUE(ValidateMatmulGroupArgs(g).ok());
  MatmulGroupArgs empty;
  empty.n_parts = 3;
  for (MatmulArgs& p : empty.parts) p.w = {nullptr, DType::kF32, 4, 4};
  EXPECT_TRUE(ValidateMatmulGroupArgs(empty).ok());  // n_tokens 0: nothing to compute

  MatmulGroupArgs bad = g;
  bad.n_parts = 4;
  EXPECT_THAT(ValidateMatmulGroupArgs(bad),
              InvalidArgument("MatmulGroup: n_parts must be in [1, 3], got 4"));
  bad = g;
  bad.parts[1].w.cols = 0;  // each part's own check first, named by its index
  EXPECT_THAT(ValidateMatmulGroupArgs(bad),
              InvalidArgument("MatmulGroup parts[1]: Matmul: w.cols must be > 0, got 0"));
  bad = g;
  bad.parts[1].w.cols = 2;
  EXPECT_THAT(ValidateMatmulGroupArgs(bad),
              InvalidArgument("MatmulGroup: parts[1] must share x, n_tokens and w.cols with "
                              "parts[0]"));
  bad = g;
  bad.parts[1].y = y0 + 8;
  EXPECT_THAT(ValidateMatmulGroupArgs(bad),
              InvalidArgument("MatmulGroup: parts[0].y must not overlap parts[1].y"));
  bad = g;
  bad.parts[1].w.data = y0;
  EXPECT_THAT(ValidateMatmulGroupArgs(bad),
              InvalidArgument("MatmulGroup: parts[0].y must not overlap parts[1].w.data"));
}

TEST(ValidateArgsTest, RmsNorm) {
  const RmsNormArgs good{Fake<float>(1), Fake<float>(2), Fake<float>(3), 2, 8, 1e-5f};
  EXPECT_TRUE(ValidateRmsNormArgs(good).ok());
  RmsNormArgs a = good;
  a.x = a.y;  // in place is allowed
  EXPECT_TRUE(ValidateRmsNormArgs(a).ok());
  a = good;
  a.dim = 0;
  a.n_tokens = -1;
  EXPECT_THAT(ValidateRmsNormArgs(a), InvalidArgument("RmsNorm: dim must be > 0, got 0"));
  // eps is checked even for an empty call, and must be finite (the CPU's rule, now CUDA's too).
  for (const float eps : {-1.0f, NAN, INFINITY}) {
    a = {.n_tokens = 0, .dim = 8, .eps = eps};
    EXPECT_THAT(ValidateRmsNormArgs(a), InvalidArgument("RmsNorm: eps must be finite and >= 0"));
  }
  a = good;
  a.weight = nullptr;
  EXPECT_THAT(ValidateRmsNormArgs(a), InvalidArgument("RmsNorm: weight must not be null"));
}

TEST(ValidateArgsTest, Rope) {
  const RopeArgs good{Fake<float>(1), Fake<int32_t>(2), Fake<float>(3), 2, 4, 8};
  EXPECT_TRUE(ValidateRopeArgs(good).ok());
  EXPECT_TRUE(ValidateRopeArgs({.n_tokens = 0, .n_heads = 4, .head_dim = 8}).ok());
  RopeArgs a = good;
  a.head_dim = 7;
  a.n_tokens = -1;  // the head shape is checked first
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: head_dim must be even, got 7"));
  a = good;
  a.n_heads = int64_t{1} << 30;
  a.head_dim = int64_t{1} << 20;
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: n_heads x head_dim = 1073741824 x "
                                                   "1048576 elements is out of range"));
  a = good;
  a.n_tokens = int64_t{1} << 44;
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: n_tokens x n_heads x head_dim = "
                                                   "17592186044416 x 32 elements is out of range"));
  a = good;
  a.inv_freq = nullptr;
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: inv_freq must not be null"));

  // The keys beside the queries.
  a = good;
  a.x2 = Fake<float>(4);
  a.n_heads2 = 2;
  EXPECT_TRUE(ValidateRopeArgs(a).ok());
  a.n_heads2 = -1;
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: n_heads2 must be >= 0, got -1"));
  a.n_heads2 = 2;
  a.x2 = nullptr;
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: x2 must not be null"));
  a.x2 = good.x + 8;
  EXPECT_THAT(ValidateRopeArgs(a), InvalidArgument("Rope: x2 must not overlap x"));
}

TEST(ValidateArgsTest, StoreKv) {
  const int32_t tables[4] = {0, 1, 2, 3};
  const StoreKvArgs good{.k = Fake<float>(3),
                         .v = Fake<float>(4),
                         .cache = GoodCache(tables),
                         .token_seq = Fake<int32_t>(5),
                         .slot = Fake<int32_t>(6),
                         .n_tokens = 2};
  EXPECT_TRUE(ValidateStoreKvArgs(good).ok());
  StoreKvArgs a = good;
  a.n_tokens = 0;
  a.k = nullptr;
  EXPECT_TRUE(ValidateStoreKvArgs(a).ok());
  a = good;
  a.cache.block_size = 0;
  EXPECT_THAT(ValidateStoreKvArgs(a),
              InvalidArgument("StoreKv: cache.block_size must be > 0, got 0"));
  a = good;
  a.n_tokens = int64_t{1} << 47;
  EXPECT_THAT(ValidateStoreKvArgs(a),
              InvalidArgument("StoreKv: n_tokens x cache.kv_dim = 140737488355328 x 4 elements "
                              "is out of range"));
  a = good;
  a.slot = nullptr;
  EXPECT_THAT(ValidateStoreKvArgs(a), InvalidArgument("StoreKv: slot must not be null"));
}

TEST(ValidateArgsTest, Attention) {
  const int32_t tables[4] = {0, 1, 2, 3};
  float q[16] = {};
  float out[16] = {};
  const AttentionArgs good{.q = q,
                           .out = out,
                           .cache = GoodCache(tables),
                           .token_seq = Fake<int32_t>(5),
                           .slot = Fake<int32_t>(6),
                           .n_tokens = 2,
                           .n_heads = 2,
                           .n_kv_heads = 1,
                           .head_dim = 4,
                           .scale = 0.5f};
  EXPECT_TRUE(ValidateAttentionArgs(good).ok());
  AttentionArgs a = good;
  a.out = q;  // in place is allowed
  EXPECT_TRUE(ValidateAttentionArgs(a).ok());
  a = good;
  a.n_kv_heads = 3;
  EXPECT_THAT(ValidateAttentionArgs(a),
              InvalidArgument("Attention: n_heads (2) must be a multiple of n_kv_heads (3)"));
  a = good;
  a.head_dim = 2;
  EXPECT_THAT(ValidateAttentionArgs(a),
              InvalidArgument("Attention: cache.kv_dim (4) must equal n_kv_heads x head_dim "
                              "(1 x 2)"));
  a = good;
  a.n_heads = int64_t{1} << 30;
  a.head_dim = int64_t{1} << 20;
  EXPECT_THAT(ValidateAttentionArgs(a), InvalidArgument("Attention: n_heads x head_dim = "
                                                        "1073741824 x 1048576 elements is out "
                                                        "of range"));
  for (const float scale : {INFINITY, NAN}) {
    a = good;
    a.scale = scale;
    EXPECT_THAT(ValidateAttentionArgs(a), InvalidArgument("Attention: scale must be finite"));
  }
  a = good;
  a.out = q + 1;
  a.token_seq = nullptr;  // the overlap is reported first
  EXPECT_THAT(ValidateAttentionArgs(a), InvalidArgument("Attention: out must not overlap q"));
  a = good;
  a.token_seq = nullptr;
  EXPECT_THAT(ValidateAttentionArgs(a), InvalidArgument("Attention: token_seq must not be null"));
  a = good;
  a.tree_mask = Fake<uint64_t>(7);
  EXPECT_THAT(ValidateAttentionArgs(a), InvalidArgument("Attention: mask_start must not be null"));
  a.mask_start = Fake<int32_t>(8);
  EXPECT_TRUE(ValidateAttentionArgs(a).ok());
}

TEST(ValidateArgsTest, ElementwiseOps) {
  EXPECT_TRUE(ValidateSwiGluArgs({Fake<float>(1), Fake<float>(2), Fake<float>(1), 2, 8}).ok());
  EXPECT_TRUE(ValidateSwiGluArgs({nullptr, nullptr, nullptr, 0, 8}).ok());
  EXPECT_THAT(ValidateSwiGluArgs({nullptr, nullptr, nullptr, -1, 0}),
              InvalidArgument("SwiGlu: dim must be > 0, got 0"));
  EXPECT_THAT(ValidateSwiGluArgs({nullptr, nullptr, nullptr, -1, 8}),
              InvalidArgument("SwiGlu: n_tokens must be >= 0, got -1"));
  EXPECT_THAT(ValidateSwiGluArgs({Fake<float>(1), nullptr, Fake<float>(3), 2, 8}),
              InvalidArgument("SwiGlu: up must not be null"));

  float rows[32] = {};
  const int32_t* ids = Fake<int32_t>(2);
  EXPECT_TRUE(ValidateGatherRowsArgs({rows, ids, rows + 16, 2, 2, 8}).ok());
  EXPECT_THAT(ValidateGatherRowsArgs({rows, ids, rows + 8, 2, 2, 8}),
              InvalidArgument("GatherRows: dst must not overlap src"));
  EXPECT_THAT(ValidateGatherRowsArgs({rows, ids, rows + 16, 2, -1, 0}),
              InvalidArgument("GatherRows: dim must be > 0, got 0"));
  EXPECT_THAT(ValidateGatherRowsArgs({rows, ids, rows + 16, -4, 2, 8}),
              InvalidArgument("GatherRows: n_src must be >= 0, got -4"));
  EXPECT_THAT(ValidateGatherRowsArgs({rows, nullptr, rows + 16, 2, 2, 8}),
              InvalidArgument("GatherRows: rows must not be null"));
}

TEST(ValidateArgsTest, Embedding) {
  const EmbeddingArgs good{
      {Fake<void>(1), DType::kF16, 50, 8}, Fake<int32_t>(2), Fake<float>(3), 5};
  EXPECT_TRUE(ValidateEmbeddingArgs(good).ok());
  EmbeddingArgs a = good;
  a.table.rows = 0;
  EXPECT_THAT(ValidateEmbeddingArgs(a),
              InvalidArgument("Embedding: table.rows must be > 0, got 0"));
  a = good;
  a.table.rows = int64_t{1} << 30;
  a.table.cols = int64_t{1} << 20;
  a.n_tokens = -1;  // the table is checked first
  EXPECT_THAT(ValidateEmbeddingArgs(a), InvalidArgument("Embedding: table.rows x table.cols = "
                                                        "1073741824 x 1048576 elements is out "
                                                        "of range"));
  a = good;
  a.n_tokens = int64_t{1} << 46;
  EXPECT_THAT(ValidateEmbeddingArgs(a), InvalidArgument("Embedding: n_tokens x table.cols = "
                                                        "70368744177664 x 8 elements is out of "
                                                        "range"));
  a = good;
  a.ids = nullptr;
  EXPECT_THAT(ValidateEmbeddingArgs(a), InvalidArgument("Embedding: ids must not be null"));
  a.n_tokens = 0;
  EXPECT_TRUE(ValidateEmbeddingArgs(a).ok());
}

TEST(ValidateArgsTest, CopyKvRows) {
  const CopyKvRowsArgs good{.k = Fake<void>(1),
                            .v = Fake<void>(2),
                            .dtype = DType::kF16,
                            .n_layers = 2,
                            .layer_stride = 64,
                            .kv_dim = 8,
                            .src_rows = Fake<int32_t>(3),
                            .dst_rows = Fake<int32_t>(4),
                            .n = 3};
  EXPECT_TRUE(ValidateCopyKvRowsArgs(good).ok());
  CopyKvRowsArgs a = good;
  a.n = -1;
  EXPECT_THAT(ValidateCopyKvRowsArgs(a), InvalidArgument("CopyKvRows: n must be >= 0, got -1"));
  a = good;
  a.layer_stride = int64_t{1} << 45;
  EXPECT_THAT(ValidateCopyKvRowsArgs(a),
              InvalidArgument("CopyKvRows: n_layers x layer_stride x kv_dim = 70368744177664 x "
                              "8 elements is out of range"));
  a = good;
  a.dst_rows = nullptr;
  EXPECT_THAT(ValidateCopyKvRowsArgs(a), InvalidArgument("CopyKvRows: dst_rows must not be null"));
  a.n = 0;
  EXPECT_TRUE(ValidateCopyKvRowsArgs(a).ok());
}

TEST(ValidateArgsTest, CombineLogits) {
  const CombineLogitsArgs good{Fake<float>(1), 4, 100, Fake<int32_t>(2), Fake<int32_t>(3),
                               Fake<float>(4), 2};
  EXPECT_TRUE(ValidateCombineLogitsArgs(good).ok());
  CombineLogitsArgs a = good;
  a.vocab = 0;
  EXPECT_THAT(ValidateCombineLogitsArgs(a),
              InvalidArgument("CombineLogits: vocab must be > 0, got 0"));
  a = good;
  a.scale = nullptr;
  EXPECT_THAT(ValidateCombineLogitsArgs(a),
              InvalidArgument("CombineLogits: scale must not be null"));
  a.n_pairs = 0;
  EXPECT_TRUE(ValidateCombineLogitsArgs(a).ok());
}

TEST(ValidateArgsTest, ProcessRows) {
  std::vector<float> memory(10 * 100);
  ProcessRowsArgs good;
  good.logits = memory.data();
  good.n_rows = 2;
  good.vocab = 100;
  good.rows = Fake<RowSampling>(1);
  good.probs = memory.data() + 200;
  good.prob_capacity = 8;
  good.argmax = Fake<int32_t>(2);
  good.error = Fake<int32_t>(3);
  EXPECT_TRUE(ValidateProcessRowsArgs(good).ok());
  ProcessRowsArgs a = good;
  a.history_len = -1;
  EXPECT_THAT(ValidateProcessRowsArgs(a),
              InvalidArgument("ProcessRows: history_len must be >= 0, got -1"));
  a = good;
  a.error = nullptr;
  EXPECT_THAT(ValidateProcessRowsArgs(a), InvalidArgument("ProcessRows: error must not be null"));
  a = good;
  a.top_n = kMaxTopTokens + 1;
  EXPECT_THAT(ValidateProcessRowsArgs(a),
              InvalidArgument("ProcessRows: top_n must be in [0, 16], got 17"));
  a.vocab = 5;
  a.top_n = 6;
  EXPECT_THAT(ValidateProcessRowsArgs(a),
              InvalidArgument("ProcessRows: top_n must be in [0, 5], got 6"));
  a = good;
  a.top_n = 3;
  EXPECT_THAT(ValidateProcessRowsArgs(a), InvalidArgument("ProcessRows: top_ids must not be null"));
  // The pool must not overlap the logits (the CUDA back end's rule, now the CPU's too).
  a = good;
  a.probs = memory.data() + 199;
  EXPECT_THAT(ValidateProcessRowsArgs(a),
              InvalidArgument("ProcessRows: probs must not overlap logits"));
  a.n_rows = 0;
  EXPECT_TRUE(ValidateProcessRowsArgs(a).ok());
  // The penalised rows are neither the logits nor in the pool.
  std::vector<float> penalized(2 * 100);
  a = good;
  a.penalized = penalized.data();
  EXPECT_TRUE(ValidateProcessRowsArgs(a).ok());
  a.penalized = memory.data() + 100;
  EXPECT_THAT(ValidateProcessRowsArgs(a),
              InvalidArgument("ProcessRows: penalized must not overlap logits"));
  a.penalized = memory.data() + 999;
  EXPECT_THAT(ValidateProcessRowsArgs(a),
              InvalidArgument("ProcessRows: penalized must not overlap probs"));
}

TEST(ValidateArgsTest, SampleRowsAndGatherProbs) {
  const SampleRowsArgs draws{
      Fake<float>(1), 4, 100, Fake<Draw>(2), 3, Fake<int32_t>(3), Fake<float>(4), Fake<int32_t>(5)};
  EXPECT_TRUE(ValidateSampleRowsArgs(draws).ok());
  SampleRowsArgs d = draws;
  d.prob_capacity = -1;
  EXPECT_THAT(ValidateSampleRowsArgs(d),
              InvalidArgument("SampleRows: prob_capacity must be >= 0, got -1"));
  d = draws;
  d.token_probs = nullptr;
  EXPECT_THAT(ValidateSampleRowsArgs(d),
              InvalidArgument("SampleRows: token_probs must not be null"));
  d.n = 0;
  EXPECT_TRUE(ValidateSampleRowsArgs(d).ok());

  const GatherProbsArgs lookups{Fake<float>(1), 4, 100, Fake<int32_t>(2), Fake<int32_t>(3),
                                Fake<float>(4), 5};
  EXPECT_TRUE(ValidateGatherProbsArgs(lookups).ok());
  GatherProbsArgs g = lookups;
  g.prob_capacity = int64_t{1} << 47;
  EXPECT_THAT(ValidateGatherProbsArgs(g),
              InvalidArgument("GatherProbs: prob_capacity x vocab = 140737488355328 x 100 "
                              "elements is out of range"));
  g = lookups;
  g.slots = nullptr;
  EXPECT_THAT(ValidateGatherProbsArgs(g), InvalidArgument("GatherProbs: slots must not be null"));
}

TEST(ValidateArgsTest, Logprobs) {
  LogprobsArgs good;
  good.logits = Fake<float>(1);
  good.n_rows = 2;
  good.vocab = 100;
  good.top_n = 5;
  good.top_ids = Fake<int32_t>(2);
  good.top_logprobs = Fake<float>(3);
  EXPECT_TRUE(ValidateLogprobsArgs(good).ok());
  LogprobsArgs a = good;
  a.top_n = kMaxTopLogprobs + 1;
  a.n_rows = 0;  // top_n is checked even when there is nothing to do
  EXPECT_THAT(ValidateLogprobsArgs(a),
              InvalidArgument("Logprobs: top_n must be in [0, 20], got 21"));
  a = good;
  a.top_logprobs = nullptr;
  EXPECT_THAT(ValidateLogprobsArgs(a), InvalidArgument("Logprobs: top_logprobs must not be null"));
  a.n_rows = 0;  // no rows: the top-N outputs are not needed
  EXPECT_TRUE(ValidateLogprobsArgs(a).ok());
  a.n_queries = 1;
  a.query_rows = Fake<int32_t>(4);
  a.query_tokens = Fake<int32_t>(5);
  EXPECT_THAT(ValidateLogprobsArgs(a),
              InvalidArgument("Logprobs: query_logprobs must not be null"));
}

TEST(ValidateArgsTest, Copy) {
  EXPECT_TRUE(ValidateCopyArgs("Upload", Fake<char>(1), Fake<char>(2), 64).ok());
  EXPECT_TRUE(ValidateCopyArgs("Upload", nullptr, nullptr, 0).ok()) << "nothing is copied";
  EXPECT_THAT(ValidateCopyArgs("Download", Fake<char>(1), Fake<char>(2), -1),
              InvalidArgument("Download: bytes must be >= 0, got -1"));
  EXPECT_THAT(ValidateCopyArgs("CopyDeviceToDevice", Fake<char>(1), nullptr, 4),
              InvalidArgument("CopyDeviceToDevice: null pointer"));
}

}  // namespace
}  // namespace specd::kernels
