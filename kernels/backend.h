// The one list of compute ops every back end implements: the CPU back end (always built) and the
// CUDA back end (built when a CUDA toolkit is found). The engine (common/engine) and the worker
// runtime (common/worker) drive a model and its sampling through this interface only, so a new
// back end is one folder under kernels/ plus its entry in the conformance suite
// (tests/kernels/conformance/).
//
// Memory. A back end owns its memory: weights, the KV cache, activations and probability rows
// are `Buffer`s it allocates (device memory on a GPU). Pointers in the Args structs below point
// into such buffers unless a field says otherwise. Host memory that crosses to the device goes
// through Upload/Download, which take a staging buffer (pinned host memory on a GPU).
//
// Execution. Ops and copies are enqueued, in call order, on the back end's one stream. Nothing
// enqueued is guaranteed to have run, and no downloaded byte may be read, until Synchronize()
// returns: that is the one point per forward pass where a caller reads results. The CPU back
// end executes eagerly; callers must not rely on that. An op returns an error when its
// arguments are wrong in a way the host can see (sizes, null pointers, and, on the CPU, the
// contents); a failure during execution is reported by the next Synchronize().
//
// Conventions shared by every op:
//  * Activations, norm weights and logits are f32. Weight matrices keep their checkpoint dtype
//    (`WeightView`) and are widened in registers, never expanded in memory. The KV cache is f32,
//    bf16 or f16 (`PagedKv::dtype`); attention reads it widened to f32.
//  * Every op works on a batch of rows (`n_tokens` tokens, `n_rows` logit rows, `n` draws).
//  * Batch invariance, the contract that makes greedy speculative decoding token-for-token
//    identical to plain decoding: an output row depends only on its own input row (and, for
//    attention, on its own sequence's KV), and is computed with the same sequence of
//    floating-point operations whatever the number of rows in the call, their order, the other
//    rows' contents, or the thread count. A back end keeps this bit for bit. Each op below
//    restates what "row" means for it.
#ifndef SPECD_KERNELS_BACKEND_H_
#define SPECD_KERNELS_BACKEND_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/philox.h"
#include "base/sampling_params.h"
#include "kernels/dtype.h"

namespace specd::kernels {

class Backend;

// What a buffer holds, for the memory figures a worker exports (weights, KV, scratch, rows).
enum class MemoryKind : uint8_t {
  kWeights = 0,
  kKvCache = 1,
  kScratch = 2,  // activations, logits, per-forward metadata
  kRows = 3,     // processed probability rows kept for a sequence's next round
  kStaging = 4,  // host memory for Upload/Download (pinned on a GPU)
};
inline constexpr int kNumMemoryKinds = 5;
std::string_view MemoryKindName(MemoryKind kind);

// Memory allocated by a back end, freed when the Buffer is destroyed. Move-only. A Buffer must
// not outlive the back end that made it.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  bool empty() const { return data_ == nullptr; }

 private:
  friend class Backend;
  Buffer(Backend* owner, void* data, int64_t bytes, MemoryKind kind)
      : owner_(owner), data_(data), bytes_(bytes), kind_(kind) {}
  void Reset();

  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kScratch;
};

//! A row-major weight matrix [rows, cols] in its checkpoint dtype.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// ---------------------------------------------------------------------------------------------
// Model ops. A row is one token.

//! y[t, o] = sum_i x[t, i] * w[o, i]   (y = x · wᵀ, as torch.nn.Linear without bias).
//! Invariance: y[t, :] is reduced over i in a fixed order that depends only on w.cols (a fixed
//! K-tiling; never a split-K chosen from n_tokens).
//! With `accumulate`, y[t, o] += that sum instead: the residual add folded into the product (the
//! finished sum is added to y in one fp32 addition, as a separate element-wise add would).
struct MatmulArgs {
  const float* x = nullptr;  //!< input [n_tokens, w.cols]
  WeightView w;              //!< weight [out = w.rows, in = w.cols]
  float* y = nullptr;        //!< output [n_tokens, w.rows]; must not alias x
  int64_t n_tokens = 0;
  bool accumulate = false;
};

//! Products of ONE input by up to kMaxMatmulGroup weights (q/k/v; gate/up), which a back end may
//! run as one launch. The parts share x and n_tokens (so w.cols) and write distinct outputs;
//! each part's y has exactly the bits its own Matmul would give.
//! With `swiglu` (two parts, gate then up, of equal rows, neither accumulating) the gated MLP's
//! first half in one op: parts[0].y receives silu(gate) * up with exactly the bits SwiGlu would
//! give on the two products, and parts[1].y is scratch the back end may leave unwritten (a GPU
//! computes both products in the same warp and never stores `up`).
//! With `input_norm.weight`, the attention's or the MLP's norm folded in: the parts' x is the
//! raw residual stream, and every product reads RMSNorm(x) (RmsNormArgs, with this weight and eps
//! over w.cols) instead, with exactly the bits of RmsNorm into `input_norm.normed` followed by the
//! group on `normed`. `normed` [n_tokens, w.cols] is scratch the back end may write or leave (a
//! GPU normalizes a decode or verify pass inside the product, saving a launch); it is x itself or
//! overlaps nothing else, and x's contents are undefined after when it is x.
inline constexpr int kMaxMatmulGroup = 3;
struct InputNorm {
  const float* weight = nullptr;  //!< [w.cols]; null: the parts read x as it is
  float eps = 1e-5f;
  float* normed = nullptr;  //!< [n_tokens, w.cols] scratch
};
struct MatmulGroupArgs {
  std::array<MatmulArgs, kMaxMatmulGroup> parts{};
  int n_parts = 0;
  bool swiglu = false;
  InputNorm input_norm;
};

//! y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight   (Llama RMSNorm, f32 math).
//! Invariance: one reduction per row, in a fixed order.
struct RmsNormArgs {
  const float* x = nullptr;       //!< input [n_tokens, dim]
  const float* weight = nullptr;  //!< [dim]
  float* y = nullptr;             //!< output [n_tokens, dim]; may alias x
  int64_t n_tokens = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
};

//! Paged KV layout of one layer: k and v are [num_blocks, block_size, kv_dim] of `dtype`, with
//! kv_dim = n_kv_heads * head_dim. KV slot s of the sequence in row r of block_tables lives in
//! block block_tables[r * max_blocks + s / block_size], slot s % block_size.
struct PagedKv {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF32;
  const int32_t* block_tables = nullptr;  //!< [n_seqs, max_blocks]
  int64_t max_blocks = 0;                 //!< row stride of block_tables
  int64_t num_blocks = 0;                 //!< blocks in k and v; table entries are below it
  int64_t block_size = 0;
  int64_t kv_dim = 0;
};

//! Writes k[t], v[t] (f32, rounded to nearest even when the cache is bf16/f16) into the cache at
//! KV slot slot[t] of sequence token_seq[t]. Tokens of one call name distinct (sequence, slot)
//! pairs: a GPU stores them in parallel, so two stores to one slot would race.
struct StoreKvArgs {
  const float* k = nullptr;            //!< [n_tokens, kv_dim]
  const float* v = nullptr;            //!< [n_tokens, kv_dim]
  PagedKv cache;                       //!< destination
  const int32_t* token_seq = nullptr;  //!< row of block_tables for each token [n_tokens]
  const int32_t* slot = nullptr;       //!< KV slot of each token [n_tokens]
  int64_t n_tokens = 0;
};

//! Rotary embedding in the Hugging Face "rotate_half" layout: within each head, element i pairs
//! with element i + head_dim/2. The angle of pair i at position p is fl32(p * inv_freq[i]).
//! `pos` is the token's position in the text, which is not always its KV slot: tree nodes at the
//! same depth share a position.
struct RopeArgs {
  float* x = nullptr;               //!< in/out [n_tokens, n_heads * head_dim]
  const int32_t* pos = nullptr;     //!< position of each token [n_tokens], >= 0
  const float* inv_freq = nullptr;  //!< [head_dim / 2], already scaled (e.g. llama3 scaling)
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  //! Optionally a second tensor of the same tokens (the keys beside the queries), rotated in the
  //! same call with the same angles: [n_tokens, n_heads2 * head_dim]; null when n_heads2 is 0.
  float* x2 = nullptr;
  int64_t n_heads2 = 0;
  //! Optionally the StoreKv that follows, run by the same call: store->k must be x2 (the keys it
  //! has just rotated) and store->n_tokens n_tokens. Every output has the bits of Rope then that
  //! StoreKv (a GPU rotates and stores a token's keys in one launch).
  std::optional<StoreKvArgs> store = std::nullopt;
};

//! Grouped-query attention over the paged cache. Token t sees KV slots [0, slot[t]] of its own
//! sequence (causal), all of them already stored, except where a tree mask narrows that: with
//! `tree_mask` set, slots below mask_start[t] are all seen, and slot mask_start[t] + j (for j in
//! [0, 64), up to slot[t]) is seen iff bit j of tree_mask[t] is set. Tree verification feeds a
//! draft tree's nodes after the committed prefix and gives each node its ancestors and itself.
//! Softmax in f32 with max subtraction.
//! Invariance: a (token, head) row reads its visible slots in increasing order, and any split of
//! the keys falls at fixed slot positions, never at points chosen from the batch.
struct AttentionArgs {
  const float* q = nullptr;             //!< [n_tokens, n_heads * head_dim]
  float* out = nullptr;                 //!< [n_tokens, n_heads * head_dim]; may alias q
  PagedKv cache;                        //!< this layer's cache, already holding every visible key
  const int32_t* token_seq = nullptr;   //!< [n_tokens]
  const int32_t* slot = nullptr;        //!< [n_tokens]
  const uint64_t* tree_mask = nullptr;  //!< [n_tokens] or null (causal)
  const int32_t* mask_start = nullptr;  //!< [n_tokens] when tree_mask is set
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

//! dst[i, :] = src[rows[i], :]: the hidden states of the tokens whose logits are wanted.
struct GatherRowsArgs {
  const float* src = nullptr;     //!< [n_src, dim]
  const int32_t* rows = nullptr;  //!< [n], each in [0, n_src)
  float* dst = nullptr;           //!< [n, dim]; must not alias src
  int64_t n_src = 0;
  int64_t n = 0;
  int64_t dim = 0;
};

//! Copies whole KV rows (one token's k and v in every layer) from src_rows[i] to dst_rows[i],
//! where a row index is block * block_size + slot. Every source is read before any destination
//! is written, so the pairs may chain (compacting an accepted tree branch moves rows down within
//! a sequence). Copy-on-write of a shared prefix block copies its block_size rows.
struct CopyKvRowsArgs {
  void* k = nullptr;  //!< layer 0 of the cache; layer l starts layer_stride rows later
  void* v = nullptr;
  DType dtype = DType::kF32;
  int64_t n_layers = 0;
  int64_t layer_stride = 0;  //!< rows per layer (num_blocks * block_size)
  int64_t kv_dim = 0;
  const int32_t* src_rows = nullptr;  //!< [n]
  const int32_t* dst_rows = nullptr;  //!< [n], distinct
  int64_t n = 0;
};

// ---------------------------------------------------------------------------------------------
// Per-token math: logits to tokens and scalars on the back end, so a GPU reads back only those.
// A row is one logit row (one sequence position); a draw or a lookup is one request.

//! Classifier-free guidance: logits[cond_rows[i]] = u + scale[i] * (c - u) elementwise, with
//! c = logits[cond_rows[i]] and u = logits[uncond_rows[i]], each operation rounded to f32 once
//! (no fused multiply-add). Row pairs are disjoint.
struct CombineLogitsArgs {
  float* logits = nullptr;  //!< [n_rows, vocab]
  int64_t n_rows = 0;
  int64_t vocab = 0;
  const int32_t* cond_rows = nullptr;    //!< [n_pairs]
  const int32_t* uncond_rows = nullptr;  //!< [n_pairs]
  const float* scale = nullptr;          //!< [n_pairs]
  int64_t n_pairs = 0;
};

//! What ProcessRows makes of one logit row.
enum class RowMode : int32_t {
  //! Penalties, then the one-hot row at the argmax (temperature 0).
  kGreedy = 0,
  //! The processed distribution (DESIGN.md's steps 1-7).
  kSample = 1,
  //! The processed distribution, then the one-hot row at its argmax (a greedy draft of a sampled
  //! request: q is a point mass, which keeps the output exact).
  kArgmaxOfProcessed = 2,
};

//! Per-row outcome codes of ProcessRows and SampleRows (0 = fine).
enum RowError : int32_t {
  kRowOk = 0,
  kRowNanLogit = 1,       //!< a logit is NaN
  kRowNoFiniteLogit = 2,  //!< every kept logit is -inf: no distribution (not for kGreedy)
  kRowBadHistory = 3,     //!< a history id is outside [0, vocab) and a penalty reads it
  kRowEmpty = 4,          //!< SampleRows: the row has no positive entry
};
//! A message for a RowError, naming what went wrong in the row.
std::string_view RowErrorMessage(int32_t code);

//! One row's processing request. Plain data, copied to the device as is.
struct RowSampling {
  SamplingParams params;
  RowMode mode = RowMode::kSample;
  int32_t prob_slot = -1;    //!< where the processed row goes in ProcessRowsArgs::probs;
                             //!< the rows of one call have distinct slots (a
                             //!< repeated one is refused)
  int64_t prompt_begin = 0;  //!< the prompt's ids: history[prompt_begin, + prompt_len)
  int64_t prompt_len = 0;
  int64_t output_begin = 0;  //!< the output's ids (this round's earlier drafts included)
  int64_t output_len = 0;
  int64_t bias_begin = 0;  //!< the request's logit_bias: biases[bias_begin, + bias_len), tokens
  int64_t bias_len = 0;    //!< ascending and distinct, biases finite
};

//! The processed distribution of DESIGN.md, row by row. For each row r:
//!  1. the row's logit bias, then penalties over history (see kernels/cpu/processed.h for the
//!     exact rounding), giving the penalised logits, written to `penalized` when that is set;
//!  2. argmax[r] = the penalised argmax, lowest id on ties;
//!  3. by mode: the processed row (temperature, top-k, softmax, top-p, min-p, renormalisation)
//!     or a one-hot row, written to probs + rows[r].prob_slot * vocab. For kArgmaxOfProcessed,
//!     argmax[r] is then the processed row's argmax (lowest id on ties), where the one-hot is.
//!  4. optionally, top_ids[r, 0..top_n): the top_n tokens by penalised logit (desc, lowest id
//!     on ties), the children of a draft-tree node (top_ids[r, 0] is step 2's argmax);
//!  5. optionally, entropy[r]: the normalized entropy −Σ s ln s / ln vocab of s = softmax of the
//!     row's *input* logits at temperature 1 (EGAG's measure of the draft's uncertainty), summed in
//!     fp64 over fp32 exponentials as in kernels/cpu/processed.h, step 4; 0 when no logit is
//!     finite.
//! error[r] gets a RowError; after an error the row's outputs are meaningless.
//! Invariance: each row is computed alone; the CPU back end is the bit-exact reference, and
//! every back end must match it bit for bit on the greedy one-hot rows, the penalised argmax and
//! top_ids (entropy within 1e-5). A kArgmaxOfProcessed row's one-hot sits at the argmax of its
//! processed row, whose probabilities another back end may round differently by an ulp, so where
//! two of them are that close its token may differ from the CPU's; each back end still picks the
//! same token for the same row every time, and since q is then exactly that one-hot the output
//! stays exact.
inline constexpr int32_t kMaxTopTokens = 16;
struct ProcessRowsArgs {
  const float* logits = nullptr;  //!< [n_rows, vocab]
  int64_t n_rows = 0;
  int64_t vocab = 0;
  const RowSampling* rows = nullptr;  //!< [n_rows]
  const int32_t* history = nullptr;   //!< token ids the rows' ranges point into
  int64_t history_len = 0;
  const TokenBias* biases = nullptr;  //!< the logit biases the rows' ranges point into
  int64_t n_biases = 0;
  float* probs = nullptr;      //!< the row pool [prob_capacity, vocab]
  int64_t prob_capacity = 0;   //!< rows in the pool; every prob_slot is below it
  float* penalized = nullptr;  //!< [n_rows, vocab] or null; apart from logits and probs
  int32_t* argmax = nullptr;   //!< [n_rows]
  int32_t* error = nullptr;    //!< [n_rows]
  int32_t top_n = 0;           //!< [0, kMaxTopTokens]
  int32_t* top_ids = nullptr;  //!< [n_rows, top_n] when top_n > 0
  float* entropy = nullptr;    //!< [n_rows] or null
};

//! One draw by inverse CDF (DESIGN.md, "Randomness"): u = StreamUniform(seed, position, purpose,
//! index, sample), then the smallest id i with u * C_last < C_i, C the fp64 prefix sums of the
//! row in id order. The CPU back end calls base/inverse_cdf.h, which sums in one sequence; a back
//! end may sum in another order (CUDA sums segments of the row in parallel), so its draw can
//! differ from the CPU's only when u * C_last falls within rounding of a prefix sum (about 1e-10
//! of draws). Each back end agrees with itself, which is what exactness needs.
struct Draw {
  int32_t prob_slot = 0;  //!< the row to draw from, in the row pool
  uint32_t position = 0;
  Purpose purpose = Purpose::kTargetSample;
  uint32_t index = 0;
  uint32_t sample = 0;
  uint64_t seed = 0;
};

//! tokens[i] ~ row draws[i].prob_slot, token_probs[i] = that row's entry for tokens[i].
struct SampleRowsArgs {
  const float* probs = nullptr;  //!< the row pool [prob_capacity, vocab]
  int64_t prob_capacity = 0;
  int64_t vocab = 0;
  const Draw* draws = nullptr;  //!< [n]
  int64_t n = 0;
  int32_t* tokens = nullptr;     //!< [n]
  float* token_probs = nullptr;  //!< [n]
  int32_t* error = nullptr;      //!< [n]: kRowOk or kRowEmpty
};

//! out[i] = probs[slots[i] * vocab + tokens[i]]: p(t) and q(y) lookups.
struct GatherProbsArgs {
  const float* probs = nullptr;  //!< the row pool [prob_capacity, vocab]
  int64_t prob_capacity = 0;
  int64_t vocab = 0;
  const int32_t* slots = nullptr;   //!< [n]
  const int32_t* tokens = nullptr;  //!< [n], each in [0, vocab)
  float* out = nullptr;             //!< [n]
  int64_t n = 0;
};

inline constexpr int32_t kMaxTopLogprobs = 20;

//! Log-probabilities of a row of logits (the penalised logits of ProcessRows: vLLM's default,
//! before temperature and truncation). With m the row's maximum and S = sum_i exp(w_i - m) in
//! fp64, logprob(t) = fl32((w_t - m) - log S) in fp64; a -inf logit has logprob -inf.
//! top_ids/top_logprobs: the row's top_n tokens by (logprob desc, id asc). queries: the logprob
//! of given (row, token) pairs.
struct LogprobsArgs {
  const float* logits = nullptr;  //!< [n_rows, vocab]
  int64_t n_rows = 0;
  int64_t vocab = 0;
  int32_t top_n = 0;                      //!< [0, kMaxTopLogprobs]
  int32_t* top_ids = nullptr;             //!< [n_rows, top_n]
  float* top_logprobs = nullptr;          //!< [n_rows, top_n]
  const int32_t* query_rows = nullptr;    //!< [n_queries]
  const int32_t* query_tokens = nullptr;  //!< [n_queries]
  float* query_logprobs = nullptr;        //!< [n_queries]
  int64_t n_queries = 0;
};

// ---------------------------------------------------------------------------------------------

// Enqueued work recorded once and replayed as one launch (a CUDA graph), so a forward pass of a
// few hundred small kernels costs one launch instead of hundreds. What a replay reads and writes
// are the pointers and sizes it was recorded with; the caller changes only memory contents
// between replays (the per-forward metadata, the activations).
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
};

// Device memory as the back end sees it (the whole device, not only this process).
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu-avx512", "cuda-sm90 (NVIDIA H100 80GB HBM3)", ...
  virtual std::string_view name() const = 0;
  // Host threads the back end computes with (0 for a device back end).
  virtual int num_threads() const = 0;
  // Whether the KV cache may be stored in `dtype`.
  virtual bool SupportsKvDtype(DType dtype) const = 0;

  // `bytes` of memory of `kind`: device memory, or pinned host memory for kStaging.
  // RESOURCE_EXHAUSTED, naming `what` and the size, when it cannot be had.
  absl::StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind, std::string_view what);
  // Bytes currently allocated, by kind (readable from any thread, for metrics).
  int64_t allocated_bytes(MemoryKind kind) const {
    return allocated_[static_cast<size_t>(kind)].load(std::memory_order_relaxed);
  }
  // Free and total device memory; UNIMPLEMENTED on the CPU (sized by flags there).
  virtual absl::StatusOr<DeviceMemory> QueryDeviceMemory() const = 0;

  // Enqueued copies. `host` must be staging memory, left unchanged (Upload) or unread
  // (Download) until the next Synchronize.
  virtual absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) = 0;
  virtual absl::Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) = 0;
  // Waits until everything enqueued has run. Returns the first execution failure since the
  // previous Synchronize.
  virtual absl::Status Synchronize() = 0;
  // OK while the back end can run work. Once a failure has left the device unusable for the rest
  // of the process (CUDA's sticky errors: an illegal address, a failed launch, an uncorrectable
  // ECC error), that failure: every later call fails too, and only a new process can use the
  // device again. Cheap (no waiting), so a worker asks after every job.
  virtual absl::Status Health() const { return absl::OkStatus(); }

  virtual absl::Status Matmul(const MatmulArgs& args) = 0;
  virtual absl::Status MatmulGroup(const MatmulGroupArgs& args) = 0;
  virtual absl::Status RmsNorm(const RmsNormArgs& args) = 0;
  virtual absl::Status Rope(const RopeArgs& args) = 0;
  virtual absl::Status StoreKv(const StoreKvArgs& args) = 0;
  virtual absl::Status Attention(const AttentionArgs& args) = 0;
  virtual absl::Status SwiGlu(const SwiGluArgs& args) = 0;
  virtual absl::Status Embedding(const EmbeddingArgs& args) = 0;
  virtual absl::Status GatherRows(const GatherRowsArgs& args) = 0;
  virtual absl::Status CopyKvRows(const CopyKvRowsArgs& args) = 0;

  virtual absl::Status CombineLogits(const CombineLogitsArgs& args) = 0;
  virtual absl::Status ProcessRows(const ProcessRowsArgs& args) = 0;
  virtual absl::Status SampleRows(const SampleRowsArgs& args) = 0;
  virtual absl::Status GatherProbs(const GatherProbsArgs& args) = 0;
  virtual absl::Status Logprobs(const LogprobsArgs& args) = 0;

  // Recording (see RecordedWork). Between BeginRecording and EndRecording, ops and copies are
  // recorded instead of enqueued; nothing may allocate, upload, download or synchronize (a
  // recorded upload would re-read, at every replay, host memory the caller has reused; a Buffer
  // may go out of scope: a back end that cannot free then releases it at EndRecording).
  // EndRecording after a failed op discards the recording and returns the stream to normal. Back
  // ends that execute eagerly (the CPU) do not record: SupportsRecording() is false and the calls
  // are UNIMPLEMENTED.
  virtual bool SupportsRecording() const { return false; }
  virtual absl::Status BeginRecording();
  virtual absl::StatusOr<std::unique_ptr<RecordedWork>> EndRecording();
  virtual absl::Status Replay(const RecordedWork& work);

 protected:
  // The memory primitives behind Allocate and ~Buffer.
  virtual absl::StatusOr<void*> AllocateRaw(int64_t bytes, MemoryKind kind) = 0;
  virtual void FreeRaw(void* data, int64_t bytes, MemoryKind kind) = 0;

 private:
  friend class Buffer;
  void Free(void* data, int64_t bytes, MemoryKind kind);

  std::array<std::atomic<int64_t>, kNumMemoryKinds> allocated_{};
};

enum class BackendKind { kCpu, kCuda, kAuto };

// "cpu", "cuda" or "auto"; INVALID_ARGUMENT otherwise.
absl::StatusOr<BackendKind> ParseBackendKind(std::string_view name);
// The inverse: "cpu", "cuda" or "auto".
std::string_view BackendKindName(BackendKind kind);

struct BackendOptions {
  BackendKind kind = BackendKind::kCpu;
  int num_threads = 0;  // CPU: host threads, <= 0 for one per core
  int device = 0;       // CUDA: device ordinal
  // CUDA: programmatic dependent launches where they work (CudaBackendOptions); off to measure.
  bool programmatic_launch = true;
};

// kAuto picks CUDA when this build has the CUDA back end and a device is present, else the CPU.
// Asking for kCuda without either is FAILED_PRECONDITION saying which is missing.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// The multi-threaded SIMD CPU back end. `num_threads` <= 0 means one per hardware core.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(int num_threads);

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_BACKEND_H_
