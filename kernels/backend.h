// The one list of compute ops every back end implements (CPU always, CUDA when built).
//
// Conventions, shared by every op:
//  * Activations, KV and norm weights are f32; large weight matrices keep their checkpoint dtype
//    (`WeightView`) and are converted in registers, never expanded in memory.
//  * Every op works on a *varlen batch* of `n_tokens` rows. Row `t` of an output depends only on
//    row `t` of the inputs (and, for attention, on its own sequence's KV), and is computed with the
//    same sequence of floating-point operations whatever `n_tokens`, the other rows or the thread
//    count. This *batch invariance* is what makes greedy speculative decoding token-for-token
//    identical to plain decoding, so every implementation must keep it bit-exact.
//  * Pointers belong to the back end's memory space (host memory for CPU).
#ifndef SPECD_KERNELS_BACKEND_H_
#define SPECD_KERNELS_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace specd::kernels {

//! A row-major weight matrix [rows, cols] in its checkpoint dtype.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

//! y[t, o] = sum_i x[t, i] * w[o, i]   (y = x · wᵀ, as torch.nn.Linear without bias)
struct MatmulArgs {
  const float* x = nullptr;  //!< input [n_tokens, w.cols]
  WeightView w;              //!< weight [out = w.rows, in = w.cols]
  float* y = nullptr;        //!< output [n_tokens, w.rows]; must not alias x
  int64_t n_tokens = 0;
};

//! y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight   (Llama RMSNorm, f32 math)
struct RmsNormArgs {
  const float* x = nullptr;       //!< input [n_tokens, dim]
  const float* weight = nullptr;  //!< [dim]
  float* y = nullptr;             //!< output [n_tokens, dim]; may alias x
  int64_t n_tokens = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
};

//! Rotary embedding in the Hugging Face "rotate_half" layout: within each head, element i pairs
//! with element i + head_dim/2. Angle of pair i at position p is p * inv_freq[i], computed in f32.
struct RopeArgs {
  float* x = nullptr;               //!< in/out [n_tokens, n_heads * head_dim]
  const int32_t* pos = nullptr;     //!< absolute position of each token [n_tokens]
  const float* inv_freq = nullptr;  //!< [head_dim / 2], already scaled (e.g. llama3 rope scaling)
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
};

//! Paged KV layout of one layer: cache[block][slot][kv_dim], kv_dim = n_kv_heads * head_dim.
//! Token t of sequence s at position p lives in block block_tables[s * max_blocks + p /
//! block_size], slot p % block_size.
struct PagedKv {
  float* k = nullptr;                     //!< [num_blocks, block_size, kv_dim]
  float* v = nullptr;                     //!< [num_blocks, block_size, kv_dim]
  const int32_t* block_tables = nullptr;  //!< [n_seqs, max_blocks]
  int64_t max_blocks = 0;                 //!< row stride of block_tables
  int64_t block_size = 0;
  int64_t kv_dim = 0;
};

//! Writes k[t], v[t] into the paged cache at (token_seq[t], pos[t]).
struct StoreKvArgs {
  const float* k = nullptr;            //!< [n_tokens, kv_dim]
  const float* v = nullptr;            //!< [n_tokens, kv_dim]
  PagedKv cache;                       //!< destination
  const int32_t* token_seq = nullptr;  //!< row of block_tables for each token [n_tokens]
  const int32_t* pos = nullptr;        //!< [n_tokens]
  int64_t n_tokens = 0;
};

//! Causal grouped-query attention over the paged cache: token t attends to positions
//! [0, pos[t]] of its own sequence, which must already be stored. Softmax in f32 with max
//! subtraction; positions are visited in increasing order.
struct AttentionArgs {
  const float* q = nullptr;            //!< [n_tokens, n_heads * head_dim]
  float* out = nullptr;                //!< [n_tokens, n_heads * head_dim]
  PagedKv cache;                       //!< this layer's cache, already holding every needed key
  const int32_t* token_seq = nullptr;  //!< [n_tokens]
  const int32_t* pos = nullptr;        //!< [n_tokens]
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  //!< n_heads % n_kv_heads == 0 (GQA)
  int64_t head_dim = 0;
  float scale = 1.0f;  //!< usually 1/sqrt(head_dim)
};

//! out[t, i] = silu(gate[t, i]) * up[t, i], silu(x) = x / (1 + exp(-x)).
struct SwiGluArgs {
  const float* gate = nullptr;  //!< [n_tokens, dim]
  const float* up = nullptr;    //!< [n_tokens, dim]
  float* out = nullptr;         //!< [n_tokens, dim]; may alias gate
  int64_t n_tokens = 0;
  int64_t dim = 0;
};

//! out[t, :] = table[ids[t], :] as f32. ids must be in [0, table.rows) (checked by the caller).
struct EmbeddingArgs {
  WeightView table;              //!< [vocab, dim]
  const int32_t* ids = nullptr;  //!< [n_tokens]
  float* out = nullptr;          //!< [n_tokens, dim]
  int64_t n_tokens = 0;
};

//! y[t, :] += x[t, :]   (residual connection)
struct AddArgs {
  float* y = nullptr;        //!< in/out [n, dim]
  const float* x = nullptr;  //!< [n, dim]
  int64_t n = 0;
  int64_t dim = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual int num_threads() const = 0;

  virtual absl::Status Matmul(const MatmulArgs& args) = 0;
  virtual absl::Status RmsNorm(const RmsNormArgs& args) = 0;
  virtual absl::Status Rope(const RopeArgs& args) = 0;
  virtual absl::Status StoreKv(const StoreKvArgs& args) = 0;
  virtual absl::Status Attention(const AttentionArgs& args) = 0;
  virtual absl::Status SwiGlu(const SwiGluArgs& args) = 0;
  virtual absl::Status Embedding(const EmbeddingArgs& args) = 0;
  virtual absl::Status Add(const AddArgs& args) = 0;
};

//! The multi-threaded SIMD CPU back end. `num_threads` <= 0 means one per hardware core.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(int num_threads);

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_BACKEND_H_
