#include "common/engine/llama_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/absl_string.h"
#include "base/math.h"
#include "base/status_macros.h"
#include "common/engine/backend_self_check.h"
#include "common/model/config.h"

namespace specd {
namespace {

// Caps the cache so a typo in a flag is an error rather than an attempt to allocate terabytes.
constexpr int64_t kMaxKvBytes = int64_t{1} << 38;  // 256 GiB
// Scratch grows in steps of this many tokens, so a run of slightly larger batches does not
// reallocate every time.
constexpr int64_t kScratchTokenStep = 64;
constexpr int64_t kMaxTreeNodes = 64;  // one 64-bit mask word per node
constexpr int64_t kMaxCopyRowsPerCall = 4096;
// The narrowest block table a recorded pass uploads (LlamaEngine::TableStride).
constexpr int64_t kMinRecordedTableStride = 8;

// The most pad tokens a recorded pass gets: the trash sequence's length.
constexpr int64_t MaxPadTokens() {
  int64_t most = 0;
  for (int64_t n = 1; n <= kMaxRecordedTokens; ++n) most = std::max(most, RecordedBucket(n) - n);
  return most;
}
constexpr int64_t kMaxPadTokens = MaxPadTokens();

// Byte offsets of the metadata arrays in the staging buffer (and its device copy).
struct MetadataLayout {
  int64_t ids, pos, slot, token_seq, block_tables, logit_rows, mask_start, tree_mask, copy_src,
      copy_dst, bytes;
};

// The copy rows come last, so a batch shape's other arrays sit at the same offsets whatever it
// copies (its recordings read them there).
MetadataLayout LayoutFor(int64_t n_tokens, int64_t n_seqs, int64_t table_stride, int64_t n_logits,
                         bool tree, int64_t n_copy_rows) {
  MetadataLayout m{};
  int64_t at = 0;
  const auto take = [&at](int64_t bytes) {
    const int64_t start = at;
    at = RoundUpTo(at + bytes, 16);
    return start;
  };
  m.ids = take(n_tokens * 4);
  m.pos = take(n_tokens * 4);
  m.slot = take(n_tokens * 4);
  m.token_seq = take(n_tokens * 4);
  m.block_tables = take(n_seqs * table_stride * 4);
  m.logit_rows = take(n_logits * 4);
  m.mask_start = take(tree ? n_tokens * 4 : 0);
  m.tree_mask = take(tree ? n_tokens * 8 : 0);
  m.copy_src = take(n_copy_rows * 4);
  m.copy_dst = take(n_copy_rows * 4);
  m.bytes = std::max<int64_t>(at, 16);
  return m;
}

// Grows `buffer` to at least `bytes` (contents are not kept). The new buffer is allocated before
// the old one is freed, so a failed growth (out of memory: RESOURCE_EXHAUSTED) leaves `buffer`
// as it was, still good for every pass it served before (the price: the old buffer is held while
// the new one is allocated). A move that happened is counted in `*generation` when given
// (recordings that point into the buffer are then stale).
absl::Status Ensure(kernels::Backend& backend, kernels::Buffer& buffer, int64_t bytes,
                    kernels::MemoryKind kind, std::string_view what, int64_t* generation) {
  if (buffer.bytes() >= bytes) return absl::OkStatus();
  SPECD_ASSIGN_OR_RETURN(kernels::Buffer grown, backend.Allocate(bytes, kind, what));
  buffer = std::move(grown);  // frees the old one
  if (generation != nullptr) ++*generation;
  return absl::OkStatus();
}

// The metadata buffers start at this size and at least double when they grow, so that the
// high-water marks of a warming-up server (a new table width, more copy-on-write rows) move the
// device copy, and so discard every recording, only a few times.
constexpr int64_t kMinMetadataBytes = int64_t{16} << 10;

// What a buffer of `have` bytes that must hold `need` grows to: `have` when it is enough.
int64_t GeometricSize(int64_t have, int64_t need) {
  if (have >= need) return have;
  return std::max({need, 2 * have, kMinMetadataBytes});
}

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

// Scratch a busy worker grows to: activations of a pass of max_pass_tokens, and logits plus kept
// probability rows for a batch of verify rows.
constexpr int64_t kReserveRows = 512;
// The CUDA back end's op workspace and the runtime's own allocations.
constexpr int64_t kReserveFixedBytes = int64_t{256} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaEngine>> LlamaEngine::Create(
    std::unique_ptr<ModelWeights> weights, std::unique_ptr<kernels::Backend> backend,
    const EngineOptions& options, const std::function<void(int64_t, int64_t)>& progress) {
  if (weights == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("engine: weights and backend are required");
  }
  const ModelConfig c = weights->config;  // a copy: the weights go away after their upload
  const int64_t max_seq_len =
      options.max_seq_len > 0 ? options.max_seq_len : c.max_position_embeddings;
  if (max_seq_len <= 0) {
    return absl::InvalidArgumentError("engine: max_seq_len must be positive");
  }
  if (options.kv_block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: kv_block_size must be positive, got ", options.kv_block_size));
  }
  if (options.kv_capacity_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine: kv_capacity_tokens must be positive, got ", options.kv_capacity_tokens));
  }
  if (options.max_pass_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: max_pass_tokens must be positive, got ", options.max_pass_tokens));
  }
  if (!backend->SupportsKvDtype(options.kv_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: the ", ToAbsl(backend->name()), " back end cannot keep a ",
                     ToAbsl(kernels::DTypeName(options.kv_dtype)), " KV cache"));
  }
  if (!(options.gpu_memory_fraction >= 0.0 && options.gpu_memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine: gpu_memory_fraction must be in [0, 1], got ", options.gpu_memory_fraction));
  }
  // The weights go up first, so that a memory share is sized from what they left.
  SPECD_ASSIGN_OR_RETURN(DeviceWeights device_weights, UploadWeights(*weights, *backend, progress));
  std::vector<int32_t> output_vocab = std::move(weights->output_vocab);
  weights.reset();  // the file mapping is no longer needed
  int64_t capacity_tokens = options.kv_capacity_tokens;
  bool sized_by_share = false;
  if (options.gpu_memory_fraction > 0.0) {
    absl::StatusOr<kernels::DeviceMemory> mem = backend->QueryDeviceMemory();
    // A back end without device memory (the CPU answers UNIMPLEMENTED) is sized by
    // kv_capacity_tokens. Any other failure is a device that could not answer: sizing the cache
    // by kv_capacity_tokens instead would silently ignore the fraction asked for.
    if (!mem.ok() && !absl::IsUnimplemented(mem.status())) {
      return absl::Status(
          mem.status().code(),
          absl::StrCat("engine: cannot size the KV cache by gpu_memory_fraction: the ",
                       ToAbsl(backend->name()),
                       " back end could not report its memory: ", mem.status().message()));
    }
    if (mem.ok()) {
      sized_by_share = true;
      const ModelMemory own = EstimateModelMemory(c, options.kv_dtype, options.max_pass_tokens);
      SPECD_ASSIGN_OR_RETURN(
          capacity_tokens,
          KvTokensForShare(own, options.gpu_memory_fraction, mem->total_bytes,
                           options.peer_fixed_bytes, options.peer_kv_bytes_per_token));
      const int64_t kv_bytes = capacity_tokens * own.kv_bytes_per_token;
      if (kv_bytes + own.scratch_reserve_bytes > mem->free_bytes) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "a KV cache of %d tokens (%.2f GiB) plus %.2f GiB of scratch needs more than the "
            "%.2f GiB free on %s (of %.2f GiB; another process holds the rest); lower "
            "--gpu-memory-fraction",
            capacity_tokens, GiB(kv_bytes), GiB(own.scratch_reserve_bytes), GiB(mem->free_bytes),
            std::string(backend->name()), GiB(mem->total_bytes)));
      }
    }
  }
  const int64_t num_blocks = CeilDiv(capacity_tokens, options.kv_block_size);
  const int64_t row_bytes = c.kv_dim() * kernels::DTypeSize(options.kv_dtype);
  const int64_t layer_rows = num_blocks * options.kv_block_size;
  if (layer_rows > kMaxKvBytes / std::max<int64_t>(1, 2 * c.num_layers * row_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine: a KV cache of ", capacity_tokens, " tokens needs ",
        2 * c.num_layers * (layer_rows >> 10) * row_bytes >> 10, " MiB, over the 256 GiB limit"));
  }
  KvPoolConfig kv_config;
  kv_config.num_blocks = num_blocks;
  kv_config.block_size = options.kv_block_size;
  kv_config.max_blocks_per_seq = CeilDiv(max_seq_len, options.kv_block_size);
  kv_config.prefix_caching = options.prefix_caching;
  // The model (its whole config, layer count after an early exit included) and the KV dtype.
  kv_config.cache_salt = absl::HashOf(ModelConfigToJson(c), kernels::DTypeName(options.kv_dtype));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<KvPool> kv, KvPool::Create(kv_config));
  const bool record = options.record_forwards && backend->SupportsRecording();
  // Recorded passes are padded, and pad tokens need a sequence of their own: a table row of
  // trash blocks (a model whose context is shorter than the padding is never padded).
  const int64_t trash_blocks =
      record && kv_config.max_blocks_per_seq * options.kv_block_size >= kMaxPadTokens
          ? CeilDiv(kMaxPadTokens, options.kv_block_size)
          : 0;
  auto engine = std::unique_ptr<LlamaEngine>(
      new LlamaEngine(c, std::move(backend), std::move(kv), max_seq_len, options.kv_dtype));
  engine->trash_blocks_ = trash_blocks;
  engine->max_pass_tokens_ = options.max_pass_tokens;
  kernels::Backend& be = *engine->backend_;
  engine->weights_ = std::move(device_weights);
  engine->output_vocab_ = std::move(output_vocab);
  const int64_t cache_bytes =
      c.num_layers * (num_blocks + trash_blocks) * options.kv_block_size * row_bytes;
  // Named with what sized them, for the user whose pool does not fit.
  const std::string cache_of =
      absl::StrCat(" cache of ", capacity_tokens, " tokens (set by ",
                   sized_by_share ? "--gpu-memory-fraction" : "--kv-tokens", ")");
  SPECD_ASSIGN_OR_RETURN(engine->k_cache_, be.Allocate(cache_bytes, kernels::MemoryKind::kKvCache,
                                                       absl::StrCat("the K", cache_of)));
  SPECD_ASSIGN_OR_RETURN(engine->v_cache_, be.Allocate(cache_bytes, kernels::MemoryKind::kKvCache,
                                                       absl::StrCat("the V", cache_of)));
  if (sized_by_share) {
    // The share counted the scratch of a full pass: take it now, so that a device without room
    // for it fails at start naming the bytes, not a pass under load.
    if (const absl::Status st = engine->GrowScratch(options.max_pass_tokens, kReserveRows);
        !st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("engine: reserving scratch for passes of ",
                                       options.max_pass_tokens, " tokens: ", st.message()));
    }
  }
  return engine;
}

LlamaEngine::LlamaEngine(ModelConfig config, std::unique_ptr<kernels::Backend> backend,
                         std::unique_ptr<KvPool> kv, int64_t max_seq_len, kernels::DType kv_dtype)
    : config_(std::move(config)),
      backend_(std::move(backend)),
      kv_(std::move(kv)),
      max_seq_len_(max_seq_len),
      kv_dtype_(kv_dtype) {}

LlamaEngine::~LlamaEngine() {
  // Nothing enqueued may still read or write memory that is about to be freed.
  (void)Synchronize();
}

int64_t LlamaEngine::kv_bytes_per_token() const {
  return 2 * config_.num_layers * config_.kv_dim() * kernels::DTypeSize(kv_dtype_);
}

absl::Status LlamaEngine::Synchronize() {
  staging_in_flight_ = false;
  return backend_->Synchronize();
}

absl::Status LlamaEngine::Validate(std::span<const SequenceInput> batch) const {
  absl::flat_hash_set<KvPool::SeqId> seen;
  const int64_t vocab = config_.vocab_size;
  for (const SequenceInput& in : batch) {
    if (!seen.insert(in.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", in.seq, " appears twice in one forward batch"));
    }
    SPECD_ASSIGN_OR_RETURN(const int64_t cached, kv_->Length(in.seq));
    if (in.start_pos != cached) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", in.seq, ": caller expects ",
                                                        in.start_pos, " cached tokens, worker has ",
                                                        cached));
    }
    if (in.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": no tokens to feed"));
    }
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (cached + n > max_seq_len_) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", in.seq, " would reach ", cached + n,
                                                " tokens, over max_seq_len ", max_seq_len_));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = in.tokens[static_cast<size_t>(i)];
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": token id ", t,
                                                       " at index ", i, " is outside [0, ", vocab,
                                                       ")"));
      }
    }
    int32_t prev = -1;
    for (const int32_t li : in.logit_indices) {
      if (li <= prev || li >= n) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": logit index ", li,
                                                       " must be increasing and below the ", n,
                                                       " fed tokens"));
      }
      prev = li;
    }
    if (!in.positions.empty()) {
      if (static_cast<int64_t>(in.positions.size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", in.seq, ": ", in.positions.size(), " positions for ", n, " tokens"));
      }
      for (const int32_t p : in.positions) {
        if (p < 0 || p >= max_seq_len_) {
          return absl::InvalidArgumentError(absl::StrCat("sequence ", in.seq, ": position ", p,
                                                         " is outside [0, ", max_seq_len_, ")"));
        }
      }
    }
    if (in.tree_mask.empty()) continue;
    const int64_t nodes = static_cast<int64_t>(in.tree_mask.size());
    const int64_t first = in.tree_first_node;
    if (in.tree_begin < 0 || in.tree_begin + nodes != n || first < 0 ||
        first + nodes > kMaxTreeNodes || in.start_pos + in.tree_begin < first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", in.seq, ": tree nodes ", first, "..", first + nodes - 1, " from token ",
          in.tree_begin, " must end at the last of the ", n, " fed tokens, follow their ", first,
          " earlier nodes in the cache, and number at most ", kMaxTreeNodes));
    }
    if (in.positions.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", in.seq, ": a draft tree needs a position for every token"));
    }
    for (int64_t j = first; j < first + nodes; ++j) {
      const uint64_t mask = in.tree_mask[static_cast<size_t>(j - first)];
      const uint64_t own = uint64_t{1} << j;
      if ((mask & own) == 0 || (j < 63 && (mask >> (j + 1)) != 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", in.seq, ": tree node ", j,
                         " must see itself and no later node (nodes are in topological order)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaEngine::UploadMetadata(std::span<const SequenceInput> batch, const Shape& shape,
                                         std::span<const KvBlockCopy> copies) {
  const bool tree = shape.tree;
  const int64_t stride = shape.table_stride;
  int64_t n_copy_rows = 0;
  for (const KvBlockCopy& c : copies) n_copy_rows += c.rows;
  const MetadataLayout m =
      LayoutFor(shape.tokens, shape.seqs, stride, shape.logits, tree, n_copy_rows);
  // Only the device copy's moves stale the recordings: staging_ is host memory that no recording
  // reads (the upload from it is enqueued before the model, never recorded).
  SPECD_RETURN_IF_ERROR(Ensure(*backend_, staging_, GeometricSize(staging_.bytes(), m.bytes),
                               kernels::MemoryKind::kStaging, "forward metadata",
                               /*generation=*/nullptr));
  SPECD_RETURN_IF_ERROR(
      Ensure(*backend_, meta_device_, GeometricSize(meta_device_.bytes(), m.bytes),
             kernels::MemoryKind::kScratch, "forward metadata", &buffers_generation_));
  char* host = staging_.as<char>();
  int32_t* ids = reinterpret_cast<int32_t*>(host + m.ids);
  int32_t* pos = reinterpret_cast<int32_t*>(host + m.pos);
  int32_t* slot = reinterpret_cast<int32_t*>(host + m.slot);
  int32_t* token_seq = reinterpret_cast<int32_t*>(host + m.token_seq);
  int32_t* tables = reinterpret_cast<int32_t*>(host + m.block_tables);
  int32_t* logit_rows = reinterpret_cast<int32_t*>(host + m.logit_rows);
  int32_t* mask_start = reinterpret_cast<int32_t*>(host + m.mask_start);
  uint64_t* tree_mask = reinterpret_cast<uint64_t*>(host + m.tree_mask);
  int32_t* copy_src = reinterpret_cast<int32_t*>(host + m.copy_src);
  int32_t* copy_dst = reinterpret_cast<int32_t*>(host + m.copy_dst);
  const int64_t block = kv_->block_size();
  int64_t c = 0;
  for (const KvBlockCopy& copy : copies) {
    for (int64_t r = 0; r < copy.rows; ++r, ++c) {
      copy_src[c] = static_cast<int32_t>(copy.src * block + r);
      copy_dst[c] = static_cast<int32_t>(copy.dst * block + r);
    }
  }
  int64_t t = 0;
  int64_t r = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceInput& in = batch[b];
    SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t>* table, kv_->BlockTable(in.seq));
    int32_t* row = tables + static_cast<int64_t>(b) * stride;
    std::copy(table->begin(), table->end(), row);
    std::fill(row + table->size(), row + stride, -1);
    for (const int32_t li : in.logit_indices) logit_rows[r++] = static_cast<int32_t>(t + li);
    for (size_t i = 0; i < in.tokens.size(); ++i, ++t) {
      ids[t] = in.tokens[i];
      slot[t] = static_cast<int32_t>(in.start_pos + static_cast<int64_t>(i));
      pos[t] = in.positions.empty() ? slot[t] : in.positions[i];
      token_seq[t] = static_cast<int32_t>(b);
      if (!tree) continue;
      // A token outside any tree sees every earlier slot and itself: the causal mask.
      const int64_t node = static_cast<int64_t>(i) - in.tree_begin;
      const bool in_tree = !in.tree_mask.empty() && node >= 0;
      mask_start[t] = in_tree
                          ? static_cast<int32_t>(in.start_pos + in.tree_begin - in.tree_first_node)
                          : slot[t];
      tree_mask[t] = in_tree ? in.tree_mask[static_cast<size_t>(node)] : 1;
    }
  }
  // Padding: pad token j is token 0 at slot and position j of the trash sequence (the table row
  // after the real ones), seeing slots 0..j as any causal token does; further pad sequences hold
  // no blocks, and pad logit rows read row 0.
  const int64_t n_seqs = static_cast<int64_t>(batch.size());
  for (int64_t b = n_seqs; b < shape.seqs; ++b) {
    int32_t* row = tables + b * stride;
    std::fill(row, row + stride, -1);
    if (b > n_seqs) continue;
    for (int64_t i = 0; i < trash_blocks_; ++i) {
      row[i] = static_cast<int32_t>(kv_->total_blocks() + i);
    }
  }
  for (int64_t j = 0; t < shape.tokens; ++t, ++j) {
    ids[t] = 0;
    slot[t] = static_cast<int32_t>(j);
    pos[t] = static_cast<int32_t>(j);
    token_seq[t] = static_cast<int32_t>(n_seqs);
    if (!tree) continue;
    mask_start[t] = slot[t];
    tree_mask[t] = 1;
  }
  std::fill(logit_rows + r, logit_rows + shape.logits, 0);
  SPECD_RETURN_IF_ERROR(backend_->Upload(meta_device_.data(), host, m.bytes));
  staging_in_flight_ = true;
  const char* dev = meta_device_.as<const char>();
  meta_.ids = reinterpret_cast<const int32_t*>(dev + m.ids);
  meta_.pos = reinterpret_cast<const int32_t*>(dev + m.pos);
  meta_.slot = reinterpret_cast<const int32_t*>(dev + m.slot);
  meta_.token_seq = reinterpret_cast<const int32_t*>(dev + m.token_seq);
  meta_.block_tables = reinterpret_cast<const int32_t*>(dev + m.block_tables);
  meta_.table_stride = stride;
  meta_.logit_rows = reinterpret_cast<const int32_t*>(dev + m.logit_rows);
  meta_.mask_start = tree ? reinterpret_cast<const int32_t*>(dev + m.mask_start) : nullptr;
  meta_.tree_mask = tree ? reinterpret_cast<const uint64_t*>(dev + m.tree_mask) : nullptr;
  meta_.copy_src = reinterpret_cast<const int32_t*>(dev + m.copy_src);
  meta_.copy_dst = reinterpret_cast<const int32_t*>(dev + m.copy_dst);
  return CopyBlocks(n_copy_rows);
}

absl::Status LlamaEngine::CopyBlocks(int64_t n_rows) {
  kernels::CopyKvRowsArgs a;
  a.k = k_cache_.data();
  a.v = v_cache_.data();
  a.dtype = kv_dtype_;
  a.n_layers = config_.num_layers;
  a.layer_stride = device_blocks() * kv_->block_size();
  a.kv_dim = config_.kv_dim();
  // A back end may bound the rows of one call (the CUDA kernel stages them in shared memory);
  // copies never chain, so splitting them changes nothing.
  for (int64_t done = 0; done < n_rows; done += kMaxCopyRowsPerCall) {
    a.src_rows = meta_.copy_src + done;
    a.dst_rows = meta_.copy_dst + done;
    a.n = std::min(kMaxCopyRowsPerCall, n_rows - done);
    SPECD_RETURN_IF_ERROR(backend_->CopyKvRows(a));
  }
  return absl::OkStatus();
}

absl::Status LlamaEngine::GrowScratch(int64_t n_tokens, int64_t n_logits) {
  const ModelConfig& c = config_;
  constexpr auto kScratch = kernels::MemoryKind::kScratch;
  // Ensure keeps a buffer it fails to grow, so when one allocation fails (out of memory), every
  // buffer still holds at least the s_.tokens (s_.logit_rows) it held: the recorded sizes stay
  // true, and every pass that ran before still runs. The buffers grown before the failure keep
  // their new size, and the next larger pass grows only the rest.
  if (n_tokens > s_.tokens) {
    const int64_t n = RoundUpTo(n_tokens, kScratchTokenStep);
    for (const auto& [buffer, width] :
         {std::pair{&s_.x, c.hidden_size}, std::pair{&s_.h, c.hidden_size},
          std::pair{&s_.q, c.q_dim()}, std::pair{&s_.att, c.q_dim()}, std::pair{&s_.k, c.kv_dim()},
          std::pair{&s_.v, c.kv_dim()}, std::pair{&s_.gate, c.intermediate_size},
          std::pair{&s_.up, c.intermediate_size}}) {
      SPECD_RETURN_IF_ERROR(
          Ensure(*backend_, *buffer, n * width * 4, kScratch, "activations", &buffers_generation_));
    }
    s_.tokens = n;
  }
  if (n_logits > s_.logit_rows) {
    const int64_t n = RoundUpTo(n_logits, 8);
    SPECD_RETURN_IF_ERROR(Ensure(*backend_, s_.xr, n * c.hidden_size * 4, kScratch,
                                 "final hidden states", &buffers_generation_));
    SPECD_RETURN_IF_ERROR(Ensure(*backend_, s_.logits, n * logits_width() * 4, kScratch, "logits",
                                 &buffers_generation_));
    s_.logit_rows = n;
  }
  return absl::OkStatus();
}

absl::Status LlamaEngine::ReserveKv(std::span<const SequenceInput> batch) {
  // The whole batch must fit before anything is appended, so a full pool costs nothing.
  int64_t need = 0;
  for (const SequenceInput& in : batch) {
    SPECD_ASSIGN_OR_RETURN(const int64_t blocks,
                           kv_->BlocksNeeded(in.seq, static_cast<int64_t>(in.tokens.size())));
    need += blocks;
    if (need > kv_->free_blocks()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache full: sequence ", in.seq, " needs ", blocks, " more blocks to hold ",
          in.start_pos + static_cast<int64_t>(in.tokens.size()), " tokens but only ",
          kv_->free_blocks() - (need - blocks), " of ", kv_->total_blocks(), " are free"));
    }
  }
  for (const SequenceInput& in : batch) {
    // Cannot fail: the lengths were validated and the capacity counted above.
    SPECD_RETURN_IF_ERROR(kv_->Append(in.seq, in.tokens));
  }
  return absl::OkStatus();
}

absl::StatusOr<Logits> LlamaEngine::Forward(std::span<const SequenceInput> batch) {
  SPECD_RETURN_IF_ERROR(Validate(batch));
  // The staging buffer is about to be rewritten: an upload from it must have run.
  if (staging_in_flight_) SPECD_RETURN_IF_ERROR(Synchronize());
  SPECD_RETURN_IF_ERROR(ReserveKv(batch));
  int64_t n_tokens = 0;
  int64_t n_logits = 0;
  for (const SequenceInput& in : batch) {
    n_tokens += static_cast<int64_t>(in.tokens.size());
    n_logits += static_cast<int64_t>(in.logit_indices.size());
  }
  absl::StatusOr<Logits> out = Enqueue(batch, n_tokens, n_logits);
  if (!out.ok()) {
    for (const SequenceInput& in : batch) (void)kv_->Truncate(in.seq, in.start_pos);
    kv_->RevertCopies();
    return out;
  }
  kv_->ConfirmCopies();
  return out;
}

absl::StatusOr<int64_t> LlamaEngine::TableStride(std::span<const SequenceInput> batch,
                                                 bool padded) const {
  int64_t longest = padded ? trash_blocks_ : 1;
  for (const SequenceInput& in : batch) {
    SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t>* table, kv_->BlockTable(in.seq));
    longest = std::max(longest, static_cast<int64_t>(table->size()));
  }
  if (!padded) return longest;
  int64_t bucket = kMinRecordedTableStride;
  while (bucket < longest) bucket *= 2;
  return std::min(bucket, kv_->max_blocks_per_seq());
}

absl::StatusOr<Logits> LlamaEngine::Enqueue(std::span<const SequenceInput> batch, int64_t n_tokens,
                                            int64_t n_logits) {
  const bool tree = std::any_of(batch.begin(), batch.end(),
                                [](const SequenceInput& in) { return !in.tree_mask.empty(); });
  const int64_t n_seqs = static_cast<int64_t>(batch.size());
  // A pass that may be recorded is padded to its bucket, and the pad rows are computed like the
  // real ones; every op is row invariant, so the real rows' bits do not change.
  const bool recorded = trash_blocks_ > 0 && n_tokens <= kMaxRecordedTokens;
  SPECD_ASSIGN_OR_RETURN(const int64_t stride, TableStride(batch, recorded));
  const Shape shape = recorded ? Shape{RecordedBucket(n_tokens), RecordedBucket(n_seqs + 1),
                                       RecordedBucket(n_logits), tree, stride}
                               : Shape{n_tokens, n_seqs, n_logits, tree, stride};
  SPECD_RETURN_IF_ERROR(UploadMetadata(batch, shape, kv_->PendingCopies()));
  SPECD_RETURN_IF_ERROR(GrowScratch(shape.tokens, shape.logits));
  if (recorded) {
    SPECD_RETURN_IF_ERROR(EnqueueModelRecorded(shape));
  } else {
    SPECD_RETURN_IF_ERROR(EnqueueModel(n_tokens, n_logits));
  }
  Logits logits{nullptr, 0, logits_width()};
  if (n_logits == 0) return logits;
  logits.data = s_.logits.as<float>();
  logits.rows = n_logits;
  return logits;
}

absl::Status LlamaEngine::EnqueueModelRecorded(const Shape& shape) {
  kernels::Backend& be = *backend_;
  if (recorded_generation_ != buffers_generation_) {
    // A buffer a recording points into has moved: every recording is stale.
    recorded_.clear();
    recorded_generation_ = buffers_generation_;
  }
  if (const auto it = recorded_.find(shape); it != recorded_.end()) {
    it->second.last_used = ++replay_clock_;
    return be.Replay(*it->second.work);
  }
  // Record a shape the second time it is seen; one-off shapes (prefill chunks) run eagerly.
  if (++shape_seen_[shape] < 2) return EnqueueModel(shape.tokens, shape.logits);
  if (!be.BeginRecording().ok()) return EnqueueModel(shape.tokens, shape.logits);
  const absl::Status enqueued = EnqueueModel(shape.tokens, shape.logits);
  absl::StatusOr<std::unique_ptr<kernels::RecordedWork>> work = be.EndRecording();
  if (!enqueued.ok() || !work.ok()) {
    // Nothing ran: run it eagerly, which reports the op's own error if there was one.
    return EnqueueModel(shape.tokens, shape.logits);
  }
  if (recorded_.size() >= kMaxRecordedShapes) {
    // The working set moved (another load, another K): the least recently replayed goes.
    auto oldest = recorded_.begin();
    for (auto it = recorded_.begin(); it != recorded_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    recorded_.erase(oldest);
  }
  Recording& recording = recorded_[shape];
  recording = {*std::move(work), ++replay_clock_};
  return be.Replay(*recording.work);
}

absl::Status LlamaEngine::EnqueueModel(int64_t n_tokens, int64_t n_logits) {
  const ModelConfig& c = config_;
  kernels::Backend& be = *backend_;
  float* x = s_.x.as<float>();
  SPECD_RETURN_IF_ERROR(be.Embedding({weights_.embed, meta_.ids, x, n_tokens}));
  SPECD_RETURN_IF_ERROR(RunLayers(n_tokens));
  if (n_logits == 0) return absl::OkStatus();
  // Final norm and classifier only for the rows asked for.
  float* xr = s_.xr.as<float>();
  SPECD_RETURN_IF_ERROR(
      be.GatherRows({x, meta_.logit_rows, xr, n_tokens, n_logits, c.hidden_size}));
  const float eps = static_cast<float>(c.rms_norm_eps);
  // final_norm, folded into the classifier (xr is scratch from here on).
  return be.MatmulGroup({.parts = {{{xr, weights_.lm_head, s_.logits.as<float>(), n_logits}}},
                         .n_parts = 1,
                         .input_norm = {weights_.final_norm, eps, xr}});
}

absl::Status LlamaEngine::RunLayers(int64_t n) {
  const ModelConfig& c = config_;
  float* x = s_.x.as<float>();
  float* h = s_.h.as<float>();
  float* q = s_.q.as<float>();
  float* k = s_.k.as<float>();
  float* v = s_.v.as<float>();
  float* att = s_.att.as<float>();
  float* gate = s_.gate.as<float>();
  float* up = s_.up.as<float>();
  const int64_t layer_bytes =
      device_blocks() * kv_->block_size() * c.kv_dim() * kernels::DTypeSize(kv_dtype_);
  const float eps = static_cast<float>(c.rms_norm_eps);
  kernels::Backend& be = *backend_;

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    kernels::PagedKv cache;
    cache.k = k_cache_.as<char>() + l * layer_bytes;
    cache.v = v_cache_.as<char>() + l * layer_bytes;
    cache.dtype = kv_dtype_;
    cache.block_tables = meta_.block_tables;
    cache.max_blocks = meta_.table_stride;
    cache.num_blocks = device_blocks();
    cache.block_size = kv_->block_size();
    cache.kv_dim = c.kv_dim();
    // attn_norm -> q/k/v -> rope -> store -> attention -> attn_out (o_proj) -> residual.
    // Grouped products with their norms folded in, one Rope for q and k that also stores k and
    // v, SwiGlu in the gate/up product and the residual folded into o_proj and down_proj save
    // launches (ten of sixteen per layer on a GPU, decoding) with the same bits as separate ops.
    SPECD_RETURN_IF_ERROR(
        be.MatmulGroup({.parts = {{{x, w.wq, q, n}, {x, w.wk, k, n}, {x, w.wv, v, n}}},
                        .n_parts = 3,
                        .input_norm = {w.attn_norm, eps, h}}));
    SPECD_RETURN_IF_ERROR(
        be.Rope({q, meta_.pos, weights_.inv_freq, n, c.num_heads, c.head_dim, k, c.num_kv_heads,
                 kernels::StoreKvArgs{k, v, cache, meta_.token_seq, meta_.slot, n}}));
    kernels::AttentionArgs a;
    a.q = q;
    a.out = att;
    a.cache = cache;
    a.token_seq = meta_.token_seq;
    a.slot = meta_.slot;
    a.tree_mask = meta_.tree_mask;
    a.mask_start = meta_.mask_start;
    a.n_tokens = n;
    a.n_heads = c.num_heads;
    a.n_kv_heads = c.num_kv_heads;
    a.head_dim = c.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    SPECD_RETURN_IF_ERROR(be.Attention(a));
    SPECD_RETURN_IF_ERROR(be.Matmul({att, w.wo, x, n, /*accumulate=*/true}));  // x += attn_out
    // ffn_norm -> gate/up with swiglu (into gate; up is scratch) -> down (ffn_out) -> residual
    SPECD_RETURN_IF_ERROR(be.MatmulGroup({.parts = {{{x, w.w_gate, gate, n}, {x, w.w_up, up, n}}},
                                          .n_parts = 2,
                                          .swiglu = true,
                                          .input_norm = {w.ffn_norm, eps, h}}));
    SPECD_RETURN_IF_ERROR(be.Matmul({gate, w.w_down, x, n, /*accumulate=*/true}));  // x += ffn_out
  }
  return absl::OkStatus();
}

absl::Status LlamaEngine::CompactKv(KvPool::SeqId seq, int64_t tree_start,
                                    std::span<const int32_t> kept_nodes) {
  SPECD_ASSIGN_OR_RETURN(const int64_t len, kv_->Length(seq));
  SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t>* table, kv_->BlockTable(seq));
  const int64_t kept = static_cast<int64_t>(kept_nodes.size());
  for (int64_t i = 0; i < kept; ++i) {
    const int32_t node = kept_nodes[static_cast<size_t>(i)];
    if (node < i || (i > 0 && node <= kept_nodes[static_cast<size_t>(i - 1)]) || tree_start < 0 ||
        tree_start + node >= len) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", seq, ": cannot keep tree node ", node, " as entry ", i,
                       " of a tree at slot ", tree_start,
                       " (the nodes must increase and lie inside the ", len, " cached tokens)"));
    }
  }
  // The KV write must not reach a block that anything else can see.
  SPECD_RETURN_IF_ERROR(kv_->CheckCompaction(seq, tree_start, kept_nodes));
  // Row pairs: a KV row is block * block_size + slot in block, in every layer alike.
  const int64_t bs = kv_->block_size();
  auto row_of = [&](int64_t slot) {
    return static_cast<int32_t>((*table)[static_cast<size_t>(slot / bs)] * bs + slot % bs);
  };
  std::vector<int32_t> pairs;  // src rows, then dst rows
  std::vector<int32_t> dst;
  for (int64_t i = 0; i < kept; ++i) {
    const int64_t from = tree_start + kept_nodes[static_cast<size_t>(i)];
    const int64_t to = tree_start + i;
    if (from == to) continue;  // already in place
    pairs.push_back(row_of(from));
    dst.push_back(row_of(to));
  }
  const int64_t n = static_cast<int64_t>(dst.size());
  if (n > 0) {
    pairs.insert(pairs.end(), dst.begin(), dst.end());
    const int64_t bytes = static_cast<int64_t>(pairs.size() * sizeof(int32_t));
    // No recorded forward pass reads these buffers, so their moves need not stale a recording.
    SPECD_RETURN_IF_ERROR(Ensure(*backend_, compact_staging_, bytes, kernels::MemoryKind::kStaging,
                                 "KV compaction rows", /*generation=*/nullptr));
    SPECD_RETURN_IF_ERROR(Ensure(*backend_, compact_device_, bytes, kernels::MemoryKind::kScratch,
                                 "KV compaction rows", /*generation=*/nullptr));
    std::memcpy(compact_staging_.data(), pairs.data(), static_cast<size_t>(bytes));
    absl::Status copied = backend_->Upload(compact_device_.data(), compact_staging_.data(), bytes);
    if (copied.ok()) {
      kernels::CopyKvRowsArgs c;
      c.k = k_cache_.data();
      c.v = v_cache_.data();
      c.dtype = kv_dtype_;
      c.n_layers = config_.num_layers;
      c.layer_stride = device_blocks() * bs;
      c.kv_dim = config_.kv_dim();
      c.src_rows = compact_device_.as<const int32_t>();
      c.dst_rows = compact_device_.as<const int32_t>() + n;
      c.n = n;
      copied = backend_->CopyKvRows(c);
    }
    // The staging rows must outlive the upload, even when a later step failed (the next
    // compaction rewrites them); compaction is rare enough to wait for it. The first error is
    // the one reported.
    const absl::Status synced = Synchronize();
    if (copied.ok()) copied = synced;
    // Nothing is recorded as moved unless it moved: the pool still holds the whole tree.
    SPECD_RETURN_IF_ERROR(copied);
  }
  // The prefix cache keys blocks by their tokens: the branch's tokens move with its KV
  // (CheckCompaction passed above, so this does not fail).
  SPECD_RETURN_IF_ERROR(kv_->CompactTokens(seq, tree_start, kept_nodes));
  return kv_->Truncate(seq, tree_start + kept);
}

absl::StatusOr<std::vector<float>> LlamaEngine::ReadLogits(const Logits& logits) {
  const int64_t bytes = logits.rows * logits.vocab * 4;
  std::vector<float> out(static_cast<size_t>(logits.rows * logits.vocab));
  if (bytes == 0) return out;
  SPECD_ASSIGN_OR_RETURN(kernels::Buffer staging,
                         backend_->Allocate(bytes, kernels::MemoryKind::kStaging, "logits"));
  SPECD_RETURN_IF_ERROR(backend_->Download(staging.data(), logits.data, bytes));
  SPECD_RETURN_IF_ERROR(Synchronize());
  std::memcpy(out.data(), staging.data(), static_cast<size_t>(bytes));
  return out;
}

ModelMemory EstimateModelMemory(const ModelConfig& c, kernels::DType kv_dtype,
                                int64_t max_pass_tokens) {
  const int64_t h = c.hidden_size;
  const int64_t per_layer = 2 * c.q_dim() * h + 2 * c.kv_dim() * h + 3 * c.intermediate_size * h;
  int64_t params = c.vocab_size * h + c.num_layers * per_layer;
  if (!c.tie_word_embeddings) params += c.vocab_size * h;
  ModelMemory m;
  m.weights_bytes = params * kernels::DTypeSize(c.torch_dtype) + (2 * c.num_layers + 2) * h * 4;
  const int64_t per_token = (2 * h + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size) * 4;
  m.scratch_reserve_bytes =
      max_pass_tokens * per_token + kReserveRows * c.vocab_size * 4 * 2 + kReserveFixedBytes;
  m.kv_bytes_per_token = 2 * c.num_layers * c.kv_dim() * kernels::DTypeSize(kv_dtype);
  return m;
}

absl::StatusOr<int64_t> KvTokensForShare(const ModelMemory& own, double fraction,
                                         int64_t total_bytes, int64_t peer_fixed_bytes,
                                         int64_t peer_kv_bytes_per_token) {
  const int64_t share = static_cast<int64_t>(fraction * static_cast<double>(total_bytes));
  const int64_t fixed = own.weights_bytes + own.scratch_reserve_bytes + peer_fixed_bytes;
  const int64_t per_token = own.kv_bytes_per_token + peer_kv_bytes_per_token;
  const int64_t tokens = share > fixed ? (share - fixed) / std::max<int64_t>(1, per_token) : 0;
  if (tokens <= 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--gpu-memory-fraction %.3f is %.2f GiB of the %.2f GiB device, but the weights "
        "(%.2f GiB) and scratch (%.2f GiB)%s leave nothing for the KV cache; raise the fraction",
        fraction, GiB(share), GiB(total_bytes), GiB(own.weights_bytes),
        GiB(own.scratch_reserve_bytes),
        peer_kv_bytes_per_token > 0
            ? absl::StrFormat(", with the other worker's %.2f GiB,", GiB(peer_fixed_bytes))
            : std::string()));
  }
  return tokens;
}

namespace {

// SelfCheckBackend once per process for each back end, device and model shape: a tool that makes
// several engines (a draft and its target, a benchmark's repetitions) pays for one check.
absl::Status SelfCheckBackendOnce(const kernels::BackendOptions& backend_options,
                                  const ModelConfig& config, const EngineOptions& options) {
  // The check's model is all the served model lends it (its config.json) and the options below.
  const std::string key =
      absl::StrCat(ToAbsl(kernels::BackendKindName(backend_options.kind)), "/",
                   backend_options.device, "/", backend_options.programmatic_launch, "/",
                   ToAbsl(kernels::DTypeName(options.kv_dtype)), "/", options.kv_block_size, "/",
                   options.record_forwards, "/", ModelConfigToJson(SelfCheckConfig(config)));
  static absl::Mutex mu(absl::kConstInit);
  // Never destroyed, so that no engine made during static destruction finds it gone.
  static auto* passed = new absl::flat_hash_set<std::string>();
  absl::MutexLock lock(&mu);
  if (passed->contains(key)) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(SelfCheckBackend(
      [&backend_options] { return kernels::CreateBackend(backend_options); }, config, options));
  passed->insert(key);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateEngine(
    const std::filesystem::path& dir, const kernels::BackendOptions& backend_options,
    const EngineOptions& options, const LoadOptions& load) {
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModelWeights(dir, load));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                         kernels::CreateBackend(backend_options));
  if (NeedsSelfCheck(*backend)) {
    SPECD_RETURN_IF_ERROR(SelfCheckBackendOnce(backend_options, weights->config, options));
  }
  return LlamaEngine::Create(std::move(weights), std::move(backend), options);
}

absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateCpuEngine(const std::filesystem::path& dir,
                                                             int num_threads,
                                                             const EngineOptions& options,
                                                             const LoadOptions& load) {
  kernels::BackendOptions backend;
  backend.kind = kernels::BackendKind::kCpu;
  backend.num_threads = num_threads;
  return CreateEngine(dir, backend, options, load);
}

}  // namespace specd
