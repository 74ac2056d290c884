#include "common/sampling/row_sampler.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/math.h"
#include "base/status_macros.h"
#include "common/sampling/staging.h"

namespace specd {
namespace {

using sampling_internal::EnqueueAndWait;
using sampling_internal::Ensure;
using sampling_internal::Get;
using sampling_internal::Layout;
using sampling_internal::Put;

bool ReadsHistory(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

}  // namespace

void RowSampler::Clear() {
  keep_penalized_ = false;
  rows_.clear();
  history_.clear();
  biases_.clear();
  draws_.clear();
  lookup_slots_.clear();
  lookup_tokens_.clear();
  top_n_ = 0;
  want_entropy_ = false;
  cond_rows_.clear();
  uncond_rows_.clear();
  scales_.clear();
}

void RowSampler::RequestTopTokens(int32_t n) { top_n_ = std::max(top_n_, n); }

int32_t RowSampler::AddRow(const SamplingParams& params, kernels::RowMode mode,
                           std::span<const int32_t> prompt, std::span<const int32_t> output,
                           int32_t slot, std::span<const TokenBias> bias) {
  kernels::RowSampling row;
  row.params = params;
  row.mode = mode;
  row.prob_slot = slot;
  if (ReadsHistory(params)) {
    row.prompt_begin = static_cast<int64_t>(history_.size());
    row.prompt_len = static_cast<int64_t>(prompt.size());
    history_.insert(history_.end(), prompt.begin(), prompt.end());
    row.output_begin = static_cast<int64_t>(history_.size());
    row.output_len = static_cast<int64_t>(output.size());
    history_.insert(history_.end(), output.begin(), output.end());
  }
  row.bias_begin = static_cast<int64_t>(biases_.size());
  row.bias_len = static_cast<int64_t>(bias.size());
  biases_.insert(biases_.end(), bias.begin(), bias.end());
  rows_.push_back(row);
  return static_cast<int32_t>(rows_.size() - 1);
}

int32_t RowSampler::AddDraw(const kernels::Draw& draw) {
  draws_.push_back(draw);
  return static_cast<int32_t>(draws_.size() - 1);
}

int32_t RowSampler::AddLookup(int32_t slot, int32_t token) {
  lookup_slots_.push_back(slot);
  lookup_tokens_.push_back(token);
  return static_cast<int32_t>(lookup_slots_.size() - 1);
}

void RowSampler::AddGuidance(int32_t cond_row, int32_t uncond_row, float scale) {
  cond_rows_.push_back(cond_row);
  uncond_rows_.push_back(uncond_row);
  scales_.push_back(scale);
}

absl::Status RowSampler::Run(float* logits, int64_t logit_rows, RowPool& pool) {
  const size_t n_rows = rows_.size();
  const size_t n_draws = draws_.size();
  const size_t n_lookups = lookup_slots_.size();
  const size_t n_pairs = cond_rows_.size();
  out_argmax_.assign(n_rows, 0);
  out_row_error_.assign(n_rows, 0);
  out_tokens_.assign(n_draws, 0);
  out_draw_error_.assign(n_draws, 0);
  out_token_probs_.assign(n_draws, 0.0f);
  out_lookups_.assign(n_lookups, 0.0f);
  out_top_.assign(n_rows * static_cast<size_t>(top_n_), 0);
  out_entropy_.assign(want_entropy_ ? n_rows : 0, 0.0f);
  if (n_rows + n_draws + n_lookups + n_pairs == 0) return absl::OkStatus();

  // Inputs first, then outputs, so each crosses in one copy.
  Layout layout;
  const int64_t at_rows = layout.Take<kernels::RowSampling>(n_rows);
  const int64_t at_history = layout.Take<int32_t>(history_.size());
  const int64_t at_biases = layout.Take<TokenBias>(biases_.size());
  const int64_t at_draws = layout.Take<kernels::Draw>(n_draws);
  const int64_t at_slots = layout.Take<int32_t>(n_lookups);
  const int64_t at_tokens = layout.Take<int32_t>(n_lookups);
  const int64_t at_cond = layout.Take<int32_t>(n_pairs);
  const int64_t at_uncond = layout.Take<int32_t>(n_pairs);
  const int64_t at_scales = layout.Take<float>(n_pairs);
  const int64_t inputs_end = layout.bytes();
  const int64_t at_argmax = layout.Take<int32_t>(n_rows);
  const int64_t at_row_error = layout.Take<int32_t>(n_rows);
  const int64_t at_drawn = layout.Take<int32_t>(n_draws);
  const int64_t at_drawn_probs = layout.Take<float>(n_draws);
  const int64_t at_draw_error = layout.Take<int32_t>(n_draws);
  const int64_t at_lookups = layout.Take<float>(n_lookups);
  const int64_t at_top = layout.Take<int32_t>(out_top_.size());
  const int64_t at_entropy = layout.Take<float>(out_entropy_.size());
  const int64_t total = layout.bytes();
  SPECD_RETURN_IF_ERROR(
      Ensure(*backend_, staging_, total, kernels::MemoryKind::kStaging, "sampling inputs"));
  SPECD_RETURN_IF_ERROR(
      Ensure(*backend_, device_, total, kernels::MemoryKind::kScratch, "sampling inputs"));

  char* host = staging_.as<char>();
  Put(host, at_rows, rows_);
  Put(host, at_history, history_);
  Put(host, at_biases, biases_);
  Put(host, at_draws, draws_);
  Put(host, at_slots, lookup_slots_);
  Put(host, at_tokens, lookup_tokens_);
  Put(host, at_cond, cond_rows_);
  Put(host, at_uncond, uncond_rows_);
  Put(host, at_scales, scales_);
  char* dev = device_.as<char>();
  SPECD_RETURN_IF_ERROR(backend_->Upload(dev, host, inputs_end));

  const auto i32 = [dev](int64_t at) { return reinterpret_cast<int32_t*>(dev + at); };
  const auto f32 = [dev](int64_t at) { return reinterpret_cast<float*>(dev + at); };
  SPECD_RETURN_IF_ERROR(EnqueueAndWait(*backend_, [&]() -> absl::Status {
    if (n_pairs > 0) {
      // The guided logits are formed before anything reads them: penalties, temperature and the
      // rest of the processed distribution then apply to the combined row (DESIGN.md, "The
      // processed distribution").
      kernels::CombineLogitsArgs c;
      c.logits = logits;
      c.n_rows = logit_rows;
      c.vocab = pool.vocab();
      c.cond_rows = i32(at_cond);
      c.uncond_rows = i32(at_uncond);
      c.scale = f32(at_scales);
      c.n_pairs = static_cast<int64_t>(n_pairs);
      SPECD_RETURN_IF_ERROR(backend_->CombineLogits(c));
    }
    if (n_rows > 0) {
      kernels::ProcessRowsArgs p;
      p.logits = logits;
      p.n_rows = static_cast<int64_t>(n_rows);
      p.vocab = pool.vocab();
      p.rows = reinterpret_cast<const kernels::RowSampling*>(dev + at_rows);
      p.history = i32(at_history);
      p.history_len = static_cast<int64_t>(history_.size());
      p.biases = reinterpret_cast<const TokenBias*>(dev + at_biases);
      p.n_biases = static_cast<int64_t>(biases_.size());
      p.probs = pool.rows();
      p.prob_capacity = pool.capacity();
      p.argmax = i32(at_argmax);
      p.error = i32(at_row_error);
      p.top_n = top_n_;
      p.top_ids = top_n_ > 0 ? i32(at_top) : nullptr;
      p.entropy = want_entropy_ ? f32(at_entropy) : nullptr;
      if (keep_penalized_) {
        SPECD_RETURN_IF_ERROR(Ensure(*backend_, penalized_,
                                     static_cast<int64_t>(n_rows) * pool.vocab() * 4,
                                     kernels::MemoryKind::kScratch, "penalised logits"));
        p.penalized = penalized_.as<float>();
        vocab_ = pool.vocab();
      }
      SPECD_RETURN_IF_ERROR(backend_->ProcessRows(p));
    }
    if (n_draws > 0) {
      kernels::SampleRowsArgs d;
      d.probs = pool.rows();
      d.prob_capacity = pool.capacity();
      d.vocab = pool.vocab();
      d.draws = reinterpret_cast<const kernels::Draw*>(dev + at_draws);
      d.n = static_cast<int64_t>(n_draws);
      d.tokens = i32(at_drawn);
      d.token_probs = f32(at_drawn_probs);
      d.error = i32(at_draw_error);
      SPECD_RETURN_IF_ERROR(backend_->SampleRows(d));
    }
    if (n_lookups > 0) {
      kernels::GatherProbsArgs g;
      g.probs = pool.rows();
      g.prob_capacity = pool.capacity();
      g.vocab = pool.vocab();
      g.slots = i32(at_slots);
      g.tokens = i32(at_tokens);
      g.out = f32(at_lookups);
      g.n = static_cast<int64_t>(n_lookups);
      SPECD_RETURN_IF_ERROR(backend_->GatherProbs(g));
    }
    SPECD_RETURN_IF_ERROR(
        backend_->Download(host + inputs_end, dev + inputs_end, total - inputs_end));
    return absl::OkStatus();
  }));
  Get(host, at_argmax, out_argmax_);
  Get(host, at_row_error, out_row_error_);
  Get(host, at_drawn, out_tokens_);
  Get(host, at_drawn_probs, out_token_probs_);
  Get(host, at_draw_error, out_draw_error_);
  Get(host, at_lookups, out_lookups_);
  Get(host, at_top, out_top_);
  Get(host, at_entropy, out_entropy_);
  return absl::OkStatus();
}

}  // namespace specd
