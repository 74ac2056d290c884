// The per-token math of one forward pass, run on the back end: logit rows become processed rows
// in a RowPool (DESIGN.md, "The processed distribution"), then draws by inverse CDF from Philox
// uniforms (DESIGN.md, "Randomness") and probability lookups. The inputs go up in one upload, the
// three ops are enqueued in that order, and only tokens and scalars come back, after the one
// synchronization of the pass. A GPU thus never copies a (K+1) x V block of rows to the host.
//
// Usage: Clear, Add* for the pass, Run, then read the results by the indices Add* returned.
#ifndef SPECD_COMMON_SAMPLING_ROW_SAMPLER_H_
#define SPECD_COMMON_SAMPLING_ROW_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "base/sampling_params.h"
#include "common/sampling/row_pool.h"
#include "kernels/backend.h"

namespace specd {

class RowSampler {
 public:
  explicit RowSampler(kernels::Backend& backend) : backend_(&backend) {}

  void Clear();

  // Processes the next logit row (the i-th call takes row i of Run's `logits`) into pool slot
  // `slot` with `mode`. The history (prompt and output, this round's earlier drafts included) is
  // copied, and only when a penalty reads it; so is the request's logit bias (ascending tokens).
  // Returns i, for argmax() and row_error().
  int32_t AddRow(const SamplingParams& params, kernels::RowMode mode,
                 std::span<const int32_t> prompt, std::span<const int32_t> output, int32_t slot,
                 std::span<const TokenBias> bias = {});
  // A draw from a pool row (processed in this pass or kept from an earlier one). Returns its
  // index for token(), token_prob() and draw_error().
  int32_t AddDraw(const kernels::Draw& draw);
  // The probability of `token` in pool row `slot`. Returns its index for lookup().
  int32_t AddLookup(int32_t slot, int32_t token);
  // Every row of the pass also gets its top `n` tokens by penalised logit (top_token()); the
  // largest n asked for in a pass wins.
  void RequestTopTokens(int32_t n);
  // Every row of the pass also gets the normalized entropy of its raw logits (entropy()).
  void RequestEntropy() { want_entropy_ = true; }
  // Classifier-free guidance: before anything is processed, logit row `cond_row` becomes
  // u + scale * (c - u) with u = logit row `uncond_row` (Backend::CombineLogits, in place). A
  // companion's rows sit after every row that AddRow processes.
  void AddGuidance(int32_t cond_row, int32_t uncond_row, float scale);
  // Makes this pass's Run also write every row's penalised logits to back-end memory, where
  // penalized(row) finds them until the next Run (the logprobs are computed from them).
  void KeepPenalized() { keep_penalized_ = true; }

  // Enqueues CombineLogits over `logits` ([logit_rows, pool.vocab()] in back-end memory; may be
  // null when no row was added), ProcessRows over its first rows (one per AddRow), SampleRows and
  // GatherProbs, downloads the results and synchronizes the back end. An error here is an
  // argument error or a back-end failure; a bad row shows in row_error()/draw_error() instead.
  absl::Status Run(float* logits, int64_t logit_rows, RowPool& pool);

  int32_t argmax(int32_t row) const { return out_argmax_[static_cast<size_t>(row)]; }
  int32_t row_error(int32_t row) const { return out_row_error_[static_cast<size_t>(row)]; }
  int32_t token(int32_t draw) const { return out_tokens_[static_cast<size_t>(draw)]; }
  float token_prob(int32_t draw) const { return out_token_probs_[static_cast<size_t>(draw)]; }
  int32_t draw_error(int32_t draw) const { return out_draw_error_[static_cast<size_t>(draw)]; }
  float lookup(int32_t i) const { return out_lookups_[static_cast<size_t>(i)]; }
  int32_t top_token(int32_t row, int32_t rank) const {
    return out_top_[static_cast<size_t>(row * top_n_ + rank)];
  }
  float entropy(int32_t row) const { return out_entropy_[static_cast<size_t>(row)]; }
  // Row `row`'s penalised logits ([vocab], back-end memory) after a Run with KeepPenalized.
  const float* penalized(int32_t row) const {
    return penalized_.as<float>() + static_cast<int64_t>(row) * vocab_;
  }

 private:
  kernels::Backend* backend_;
  // Inputs, as they go up.
  std::vector<kernels::RowSampling> rows_;
  std::vector<int32_t> history_;
  std::vector<TokenBias> biases_;
  std::vector<kernels::Draw> draws_;
  std::vector<int32_t> lookup_slots_;
  std::vector<int32_t> lookup_tokens_;
  int32_t top_n_ = 0;
  bool want_entropy_ = false;
  std::vector<int32_t> cond_rows_, uncond_rows_;
  std::vector<float> scales_;
  bool keep_penalized_ = false;
  // Results, as they come back.
  std::vector<int32_t> out_argmax_, out_row_error_, out_tokens_, out_draw_error_, out_top_;
  std::vector<float> out_token_probs_, out_lookups_, out_entropy_;
  kernels::Buffer staging_;
  kernels::Buffer device_;
  kernels::Buffer penalized_;  // [rows, vocab_] when kept
  int64_t vocab_ = 0;
};

}  // namespace specd

#endif  // SPECD_COMMON_SAMPLING_ROW_SAMPLER_H_
