#include "kernels/cuda/attention.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunk = static_cast<int>(kAttentionChunk);
constexpr int kMaxG = static_cast<int>(kAttentionMaxGroup);
constexpr int kMaxD = static_cast<int>(kAttentionMaxHeadDim);
constexpr int kMaxPairs = static_cast<int>(kAttentionMaxGroupTimesHeadDim);
constexpr int kGroupChunks = static_cast<int>(kAttentionGroupChunks);
constexpr int kKRegs = kMaxD / kWarp;
// Keys a warp scores, and value rows a thread reads, before using any of them, so that their
// loads overlap instead of each waiting on the last.
constexpr int kScoreBatch = 8;
constexpr int kValueBatch = 16;
constexpr int kKeysPerWarp = kChunk / kWarps;
static_assert(kKeysPerWarp % kScoreBatch == 0 && kChunk % kValueBatch == 0);
constexpr float kNegInf = -__builtin_huge_valf();
constexpr int32_t kNoBadBlock = 0x7fffffff;

struct Params {
  const float* q;
  float* out;
  PagedKv cache;
  const int32_t* token_seq;
  const int32_t* slot;
  const uint64_t* tree_mask;
  const int32_t* mask_start;
  int32_t n_kv_heads;
  int32_t group;  // query heads per KV head
  int32_t head_dim;
  float scale;
  // Split form: [token][kv head][chunk group][2 * group + group * head_dim], a group's m, l and
  // acc.
  float* partials;
  int32_t* counters;  // split form: [token][kv head], zero before the launch
  int64_t n_groups_cap;
  DeviceError* error;
};

// A softmax state over some keys: running max, sum of exponentials, weighted values.
struct State {
  float m[kMaxG], l[kMaxG];
  float acc[kMaxPairs];
};

struct Smem {
  float q[kMaxPairs];
  State total, group;
  float e[kMaxG][kChunk];  // scores, then exp(score - m_c)
  int64_t offset[kChunk];  // cache element offset of each key's row; -1 past the last key
  float mc[kMaxG], lc[kMaxG];
  // The token, read once.
  int32_t seq, slot, mask_start, ok;
  uint64_t mask;
  int32_t tree, last, bad_block;
  // The keys the token sees, numbered by rank: ranks [0, base) are slots [0, base), and rank
  // base + k is the slot of the k-th set bit of `window_bits` past base. Chunks and groups cut
  // ranks, not slots, at fixed positions, so a tree node, whose ancestors sit at slots with holes
  // between them, is reduced exactly as its path fed at consecutive slots (kernels/cpu's sums skip
  // hidden slots too, by adding exact zeros).
  int64_t base, n_keys;
  uint64_t window_bits;
};

// The slot of the key of rank `rank` (< s.n_keys).
__device__ __forceinline__ int64_t KeySlot(const Smem& s, int64_t rank) {
  if (rank < s.base) return rank;
  uint64_t bits = s.window_bits;
  for (int64_t k = rank - s.base; k > 0; --k) bits &= bits - 1;  // drop the lowest set bit
  return s.base + __ffsll(static_cast<long long>(bits)) - 1;
}

// Reads token t into `s` (its keys too) and checks it as the CPU does (kernels/cpu/attention.cc):
// its sequence and slot, the block-table entries of its prefix (also those of blocks a tree mask
// hides), and its tree mask (mask_start in [slot - 63, slot], the token's own bit set). False, for
// every thread, when the token is bad. Only a `report`ing block records the error, and it checks
// every entry of the prefix, so that it finds the lowest bad one as the CPU does; a block that
// does not report (a split block of chunk group `grp`) checks only the entries of its group's
// keys' slots, which are all it reads, because at long contexts every split block rescanning the
// whole table would read a sizeable fraction of what it reads of the keys. The reporting block of
// a bad token never counts in, so no block merges, whatever the others found.
__device__ bool CheckToken(const Params& p, int64_t t, bool report, int64_t grp, Smem& s) {
  const PagedKv& kv = p.cache;
  if (threadIdx.x == 0) {
    const int32_t seq = p.token_seq[t];
    const int32_t slot = p.slot[t];
    s.seq = seq;
    s.slot = slot;
    s.tree = p.tree_mask != nullptr;
    s.mask = s.tree ? p.tree_mask[t] : 0;
    s.mask_start = s.tree ? p.mask_start[t] : 0;
    s.bad_block = kNoBadBlock;
    s.ok = seq >= 0 && slot >= 0 && slot / kv.block_size < kv.max_blocks;
    if (!s.ok && report) {
      ReportError(p.error, DeviceOp::kAttention,
                  seq < 0 ? DeviceField::kTokenSeq : DeviceField::kSlot, t, seq < 0 ? seq : slot);
    }
  }
  __syncthreads();
  if (!s.ok) return false;
  if (threadIdx.x == 0) {
    // A bad mask_start or mask is refused below; until then its keys only need to stay within
    // [0, slot] (the clamps on the table range).
    const int64_t window = int64_t{s.slot} - s.mask_start;
    s.base = s.tree ? max(int32_t{0}, s.mask_start) : int64_t{s.slot} + 1;
    s.window_bits = !s.tree || window < 0 ? 0
                    : window >= 63        ? s.mask
                                          : s.mask & ((uint64_t{2} << window) - 1);
    s.n_keys = s.base + __popcll(s.window_bits);
  }
  __syncthreads();
  // The lowest bad entry, as the CPU reports it. Every key's block is among these, so the chunks
  // below read the table unchecked.
  const int32_t* table = kv.block_tables + int64_t{s.seq} * kv.max_blocks;
  constexpr int64_t kGroupKeys = int64_t{kChunk} * kGroupChunks;
  const int64_t last_key = s.n_keys - 1;
  const int64_t last_slot =
      report ? s.slot : min(int64_t{s.slot}, KeySlot(s, min(last_key, (grp + 1) * kGroupKeys - 1)));
  const int64_t first_slot =
      report ? 0 : max(int64_t{0}, min(last_slot, KeySlot(s, min(last_key, grp * kGroupKeys))));
  const int32_t first_block = static_cast<int32_t>(first_slot / kv.block_size);
  const int32_t last_block = static_cast<int32_t>(last_slot / kv.block_size);
  for (int32_t b = first_block + static_cast<int32_t>(threadIdx.x); b <= last_block;
       b += kThreads) {
    const int32_t block = table[b];
    if (block < 0 || block >= kv.num_blocks) atomicMin(&s.bad_block, b);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t window = int64_t{s.slot} - s.mask_start;
    if (s.bad_block != kNoBadBlock) {
      s.ok = 0;
      if (report) {
        ReportError(p.error, DeviceOp::kAttention, DeviceField::kBlockTable, t, table[s.bad_block]);
      }
    } else if (s.tree && (s.mask_start < 0 || window < 0 || window >= 64)) {
      s.ok = 0;
      // The value packs slot[t] (high half) with mask_start[t], for the CPU's message.
      if (report) {
        ReportError(
            p.error, DeviceOp::kAttention, DeviceField::kMaskStart, t,
            static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(s.slot)) << 32) |
                                 static_cast<uint32_t>(s.mask_start)));
      }
    } else if (s.tree && ((s.mask >> window) & 1) == 0) {
      s.ok = 0;
      if (report) ReportError(p.error, DeviceOp::kAttention, DeviceField::kTreeMask, t, window);
    }
  }
  __syncthreads();
  return s.ok != 0;
}

// Where token t's query heads of KV head kvh start in q and out: [group, head_dim] floats.
__device__ int64_t HeadsOffset(const Params& p, int64_t t, int kvh) {
  return (t * p.n_kv_heads * p.group + int64_t{kvh} * p.group) * p.head_dim;
}

// Zeros for token t's heads of KV head kvh, so nothing downstream reads garbage.
__device__ void ZeroOutput(const Params& p, int64_t t, int kvh) {
  float* out = p.out + HeadsOffset(p, t, kvh);
  for (int i = threadIdx.x; i < p.group * p.head_dim; i += kThreads) out[i] = 0.0f;
}

__device__ void LoadQuery(const Params& p, int64_t t, int kvh, Smem& s) {
  const float* q = p.q + HeadsOffset(p, t, kvh);
  for (int i = threadIdx.x; i < p.group * p.head_dim; i += kThreads) s.q[i] = q[i];
  __syncthreads();
}

// Scores, exponentials and the chunk's (m_c, l_c) in shared memory, for the keys of ranks
// [64c, 64c + 64); c must hold at least one key. kD is the cache's dtype.
template <DType kD>
__device__ void ScoreChunk(const Params& p, int kvh, int64_t c, Smem& s) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int G = p.group;
  const int hd = p.head_dim;
  const PagedKv& kv = p.cache;
  if (threadIdx.x < kChunk) {
    const int64_t rank = c * kChunk + threadIdx.x;
    int64_t offset = -1;
    if (rank < s.n_keys) {  // CheckToken checked the entry
      const int64_t slot = KeySlot(s, rank);
      const int32_t block = kv.block_tables[int64_t{s.seq} * kv.max_blocks + slot / kv.block_size];
      offset =
          (int64_t{block} * kv.block_size + slot % kv.block_size) * kv.kv_dim + int64_t{kvh} * hd;
    }
    s.offset[threadIdx.x] = offset;
  }
  __syncthreads();

  // q . k for every key: lane i holds dims i, i + 32, ...; one fused multiply-add chain per lane
  // in that order, then the butterfly. A warp scores its keys kScoreBatch at a time, issuing all
  // their rows' loads before it widens any.
  const CacheBits<kD>* k_cache = static_cast<const CacheBits<kD>*>(kv.k);
  for (int j0 = warp * kKeysPerWarp; j0 < (warp + 1) * kKeysPerWarp; j0 += kScoreBatch) {
    CacheBits<kD> kr[kScoreBatch][kKRegs] = {};
#pragma unroll
    for (int u = 0; u < kScoreBatch; ++u) {
      const int64_t offset = s.offset[j0 + u];
#pragma unroll
      for (int i = 0; i < kKRegs; ++i) {
        const int d = lane + i * kWarp;
        if (offset >= 0 && d < hd) kr[u][i] = k_cache[offset + d];
      }
    }
#pragma unroll
    for (int u = 0; u < kScoreBatch; ++u) {
      const int j = j0 + u;
      if (s.offset[j] < 0) {
        for (int g = lane; g < G; g += kWarp) s.e[g][j] = kNegInf;
        continue;
      }
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kKRegs; ++i) {
          const int d = lane + i * kWarp;
          if (d < hd) dot = fmaf(s.q[g * hd + d], WidenCache<kD>(kr[u][i]), dot);
        }
        dot = WarpSum(dot);
        if (lane == 0) s.e[g][j] = __fmul_rn(dot, p.scale);
      }
    }
  }
  __syncthreads();
  // Per head: the chunk's max, the exponentials and their sum, over lanes (j, j + 32).
  for (int g = warp; g < G; g += kWarps) {
    const float s0 = s.e[g][lane];
    const float s1 = s.e[g][lane + kWarp];
    const float m = WarpMax(fmaxf(s0, s1));
    const float e0 = s0 == kNegInf ? 0.0f : expf(__fsub_rn(s0, m));
    const float e1 = s1 == kNegInf ? 0.0f : expf(__fsub_rn(s1, m));
    s.e[g][lane] = e0;
    s.e[g][lane + kWarp] = e1;
    const float l = WarpSum(__fadd_rn(e0, e1));
    if (lane == 0) {
      s.mc[g] = m;
      s.lc[g] = l;
    }
  }
  __syncthreads();
}

// The merge of a part (m_p, l_p, acc_p) into a running state (m, l, acc), shared by every level
// (chunk into group, group into total) and both launch forms.
struct Coeffs {
  float m, a, b;
};
__device__ __forceinline__ Coeffs MergeCoeffs(float m_old, float m_part) {
  Coeffs k;
  k.m = fmaxf(m_old, m_part);
  k.a = m_old == kNegInf ? 0.0f : expf(__fsub_rn(m_old, k.m));
  k.b = expf(__fsub_rn(m_part, k.m));
  return k;
}
__device__ __forceinline__ float MergeValue(float acc, float part, const Coeffs& k) {
  return __fadd_rn(__fmul_rn(acc, k.a), __fmul_rn(part, k.b));
}

__device__ void InitState(const Params& p, State& st) {
  for (int i = threadIdx.x; i < p.group * p.head_dim; i += kThreads) st.acc[i] = 0.0f;
  if (threadIdx.x < p.group) {
    st.m[threadIdx.x] = kNegInf;
    st.l[threadIdx.x] = 0.0f;
  }
  __syncthreads();
}

// The second half of a merge into `st`, once every pair has merged against the old m: the heads'
// m and l move on.
__device__ void MergeMaxAndSum(const Params& p, State& st, const float* m_part,
                               const float* l_part) {
  if (threadIdx.x < p.group) {
    const int g = threadIdx.x;
    const Coeffs k = MergeCoeffs(st.m[g], m_part[g]);
    st.l[g] = MergeValue(st.l[g], l_part[g], k);
    st.m[g] = k.m;
  }
  __syncthreads();
}

// Merges a part whose per-pair values come from value(i) and whose max and sum are m_part[g],
// l_part[g] into `st`. Every pair merges against the old m before the heads' m and l move on.
template <typename Value>
__device__ void MergePart(const Params& p, State& st, const float* m_part, const float* l_part,
                          Value value) {
  for (int i = threadIdx.x; i < p.group * p.head_dim; i += kThreads) {
    const int g = i / p.head_dim;
    st.acc[i] = MergeValue(st.acc[i], value(i), MergeCoeffs(st.m[g], m_part[g]));
  }
  __syncthreads();
  MergeMaxAndSum(p, st, m_part, l_part);
}

// Merges the chunk ScoreChunk just scored into s.group: MergePart with, for pair (g, d), the
// chunk's weighted value sum, keys in ascending order, one fused multiply-add each, skipping
// weights that are exactly 0 (ranks past the last key, which have no row; for a key that is the
// same as adding 0 * v). A thread takes one d for every head g, so each value row is read once
// for all the KV head's query heads, kValueBatch rows at a time.
template <DType kD>
__device__ void MergeChunk(const Params& p, Smem& s) {
  const int G = p.group;
  const int hd = p.head_dim;
  const CacheBits<kD>* v_cache = static_cast<const CacheBits<kD>*>(p.cache.v);
  for (int d = threadIdx.x; d < hd; d += kThreads) {
    float part[kMaxG];
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) part[g] = 0.0f;
    for (int j0 = 0; j0 < kChunk; j0 += kValueBatch) {
      CacheBits<kD> v[kValueBatch] = {};
#pragma unroll
      for (int u = 0; u < kValueBatch; ++u) {
        const int64_t offset = s.offset[j0 + u];
        if (offset >= 0) v[u] = v_cache[offset + d];
      }
#pragma unroll
      for (int u = 0; u < kValueBatch; ++u) {
        const float value = WidenCache<kD>(v[u]);
#pragma unroll
        for (int g = 0; g < kMaxG; ++g) {
          const float w = g < G ? s.e[g][j0 + u] : 0.0f;
          if (w != 0.0f) part[g] = fmaf(w, value, part[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      if (g >= G) break;
      const int i = g * hd + d;
      s.group.acc[i] = MergeValue(s.group.acc[i], part[g], MergeCoeffs(s.group.m[g], s.mc[g]));
    }
  }
  __syncthreads();
  MergeMaxAndSum(p, s.group, s.mc, s.lc);
}

// The state of chunk group `grp` (up to kGroupChunks chunks merged in order from an empty state)
// in s.group.
template <DType kD>
__device__ void GroupState(const Params& p, int kvh, int64_t grp, int64_t chunks, Smem& s) {
  InitState(p, s.group);
  const int64_t end = min(chunks, (grp + 1) * kGroupChunks);
  for (int64_t c = grp * kGroupChunks; c < end; ++c) {
    ScoreChunk<kD>(p, kvh, c, s);
    MergeChunk<kD>(p, s);
  }
}

__device__ void WriteOutput(const Params& p, int64_t t, int kvh, const Smem& s) {
  const int hd = p.head_dim;
  float* out = p.out + HeadsOffset(p, t, kvh);
  for (int i = threadIdx.x; i < p.group * hd; i += kThreads) {
    out[i] = __fdiv_rn(s.total.acc[i], s.total.l[i / hd]);
  }
}

// One block per (token, KV head): every chunk group in order, merged as it goes.
template <DType kD>
__global__ void __launch_bounds__(kThreads) AttentionKernel(Params p) {
  AfterPreviousKernel();
  __shared__ Smem s;
  const int64_t t = blockIdx.x / p.n_kv_heads;
  const int kvh = static_cast<int>(blockIdx.x % p.n_kv_heads);
  if (!CheckToken(p, t, /*report=*/true, /*grp=*/0, s)) {
    ZeroOutput(p, t, kvh);
    return;
  }
  LoadQuery(p, t, kvh, s);
  InitState(p, s.total);
  const int64_t chunks = DivUp(s.n_keys, kChunk);
  const int64_t groups = DivUp(chunks, kGroupChunks);
  for (int64_t grp = 0; grp < groups; ++grp) {
    GroupState<kD>(p, kvh, grp, chunks, s);
    MergePart(p, s.total, s.group.m, s.group.l, [&](int i) { return s.group.acc[i]; });
  }
  WriteOutput(p, t, kvh, s);
}

// One block per (token, KV head, chunk group): the group's state goes to the workspace, and the
// last of the token's group blocks to arrive merges them all in group order.
template <DType kD>
__global__ void __launch_bounds__(kThreads) AttentionSplitKernel(Params p) {
  AfterPreviousKernel();
  __shared__ Smem s;
  const int64_t t = blockIdx.x / p.n_kv_heads;
  const int kvh = static_cast<int>(blockIdx.x % p.n_kv_heads);
  const int64_t grp = blockIdx.y;
  if (threadIdx.x == 0) {
    // Blocks past the group of the token's slot leave at once (their count is not waited for);
    // group 0 always runs, to report a bad token.
    const int32_t slot = p.slot[t];
    s.last = grp == 0 || (slot >= 0 && grp <= slot / (kChunk * kGroupChunks));
  }
  __syncthreads();
  if (!s.last) return;
  // Group 0 checks the whole token, reports a bad one, zeros its output and never counts in, so
  // no block merges; the other groups check what they read and leave on a bad entry there.
  if (!CheckToken(p, t, /*report=*/grp == 0, grp, s)) {
    if (grp == 0) ZeroOutput(p, t, kvh);
    return;
  }
  // A tree token's keys can end a group before its slot does: the groups past its last key leave
  // uncounted too.
  const int64_t chunks = DivUp(s.n_keys, kChunk);
  const int64_t groups = DivUp(chunks, kGroupChunks);
  if (grp >= groups) return;
  LoadQuery(p, t, kvh, s);
  const int G = p.group;
  const int hd = p.head_dim;
  const int64_t stride = 2 * G + int64_t{G} * hd;
  const int64_t pair = t * p.n_kv_heads + kvh;
  float* mine = p.partials + (pair * p.n_groups_cap + grp) * stride;
  GroupState<kD>(p, kvh, grp, chunks, s);
  if (threadIdx.x < G) {
    mine[threadIdx.x] = s.group.m[threadIdx.x];
    mine[G + threadIdx.x] = s.group.l[threadIdx.x];
  }
  for (int i = threadIdx.x; i < G * hd; i += kThreads) mine[2 * G + i] = s.group.acc[i];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s.last = atomicAdd(&p.counters[pair], 1) == groups - 1;
  __syncthreads();
  if (!s.last) return;
  __threadfence();
  // The groups' states merged in group order, as MergePart would from an empty state, but with
  // no barrier per group: each head's sum, then each pair's value, folded in registers by one
  // thread that follows its head's running max itself (the same operations, so the same bits),
  // its loads free to run ahead of its arithmetic.
  const float* all = p.partials + pair * p.n_groups_cap * stride;
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float m = kNegInf, l = 0.0f;
    for (int64_t k = 0; k < groups; ++k) {
      const float* part = all + k * stride;
      const Coeffs c = MergeCoeffs(m, __ldcg(part + g));
      l = MergeValue(l, __ldcg(part + G + g), c);
      m = c.m;
    }
    s.total.l[g] = l;
  }
  __syncthreads();
  float* out = p.out + HeadsOffset(p, t, kvh);
  for (int i = threadIdx.x; i < G * hd; i += kThreads) {
    const int g = i / hd;
    float m = kNegInf, acc = 0.0f;
#pragma unroll 4
    for (int64_t k = 0; k < groups; ++k) {
      const float* part = all + k * stride;
      const Coeffs c = MergeCoeffs(m, __ldcg(part + g));
      acc = MergeValue(acc, __ldcg(part + 2 * G + i), c);
      m = c.m;
    }
    out[i] = __fdiv_rn(acc, s.total.l[g]);
  }
}

// Launches one form of the kernel (split: a block per chunk group) for a cache of dtype kD.
template <DType kD>
void LaunchForm(const Params& p, bool split, int64_t blocks, int64_t groups_cap, bool programmatic,
                cudaStream_t stream) {
  if (split) {
    LaunchKernel(AttentionSplitKernel<kD>,
                 dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(groups_cap)), kThreads,
                 0, stream, programmatic, p);
  } else {
    LaunchKernel(AttentionKernel<kD>, static_cast<unsigned>(blocks), kThreads, 0, stream,
                 programmatic, p);
  }
}

void Launch(const Params& p, bool split, int64_t blocks, int64_t groups_cap, bool programmatic,
            cudaStream_t stream) {
  switch (p.cache.dtype) {
    case DType::kF32:
      return LaunchForm<DType::kF32>(p, split, blocks, groups_cap, programmatic, stream);
    case DType::kBF16:
      return LaunchForm<DType::kBF16>(p, split, blocks, groups_cap, programmatic, stream);
    case DType::kF16:
      return LaunchForm<DType::kF16>(p, split, blocks, groups_cap, programmatic, stream);
  }
}

int64_t GroupsCap(const PagedKv& c) {
  return DivUp(c.max_blocks * c.block_size, int64_t{kChunk} * kGroupChunks);
}

int64_t PartialFloats(const AttentionArgs& a) {
  const int64_t g = a.n_heads / a.n_kv_heads;
  return a.n_tokens * a.n_kv_heads * GroupsCap(a.cache) * (2 * g + g * a.head_dim);
}

}  // namespace

int64_t AttentionSplitWorkspaceBytes(const AttentionArgs& a) {
  return PartialFloats(a) * 4 + a.n_tokens * a.n_kv_heads * 4 + 256;
}

absl::Status LaunchAttention(const AttentionArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateAttentionArgs(a));
  // This back end's own limits: the kernel's shapes (UNIMPLEMENTED beyond them, even for an empty
  // call) and the grid's dimensions. Sequences, slots, block tables and tree masks are device
  // memory: the kernel checks them (CheckToken) and Synchronize reports them.
  const int64_t group = a.n_heads / a.n_kv_heads;
  if (group > kAttentionMaxGroup || a.head_dim > kAttentionMaxHeadDim ||
      group * a.head_dim > kAttentionMaxGroupTimesHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("Attention: the CUDA kernel takes up to ", kAttentionMaxGroup,
                     " query heads per KV head, head_dim up to ", kAttentionMaxHeadDim,
                     " and their product up to ", kAttentionMaxGroupTimesHeadDim, "; got ", group,
                     " and ", a.head_dim));
  }
  if (a.n_tokens == 0) return absl::OkStatus();
  const int64_t blocks = a.n_tokens * a.n_kv_heads;
  const int64_t groups_cap = GroupsCap(a.cache);
  if (blocks > 0x7fffffff) {
    return absl::InvalidArgumentError("Attention: batch too large for one launch");
  }
  Params p;
  p.q = a.q;
  p.out = a.out;
  p.cache = a.cache;
  p.token_seq = a.token_seq;
  p.slot = a.slot;
  p.tree_mask = a.tree_mask;
  p.mask_start = a.mask_start;
  p.n_kv_heads = static_cast<int32_t>(a.n_kv_heads);
  p.group = static_cast<int32_t>(group);
  p.head_dim = static_cast<int32_t>(a.head_dim);
  p.scale = a.scale;
  p.partials = nullptr;
  p.counters = nullptr;
  p.n_groups_cap = groups_cap;
  p.error = ctx.error;

  // Split over chunk groups when (token, KV head) pairs alone would leave most SMs idle. Either
  // form gives the same bits (see attention.h). Only the split form has a group per grid row.
  const bool fits = AttentionSplitWorkspaceBytes(a) <= ctx.workspace_bytes;
  const bool grid_fits = groups_cap <= 65535;
  bool split = ctx.attention_split > 0 ||
               (ctx.attention_split == 0 && blocks < 2 * int64_t{ctx.sm_count} && groups_cap > 1);
  if (split && (!fits || !grid_fits)) {
    if (ctx.attention_split > 0 && !fits) {
      return absl::ResourceExhaustedError(
          "Attention: the split form needs more workspace than the back end has");
    }
    if (ctx.attention_split > 0) {
      return absl::InvalidArgumentError(
          "Attention: the split form takes at most 65535 chunk groups per sequence");
    }
    split = false;
  }
  if (split) {
    p.partials = static_cast<float*>(ctx.workspace);
    p.counters = reinterpret_cast<int32_t*>(static_cast<char*>(ctx.workspace) +
                                            (PartialFloats(a) * 4 + 255) / 256 * 256);
    SPECD_RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(p.counters, 0, blocks * 4, stream), "Attention counters"));
  }
  Launch(p, split, blocks, groups_cap, ctx.programmatic_launch, stream);
  return CudaStatus(cudaGetLastError(), "Attention launch");
}

}  // namespace specd::kernels::cuda
