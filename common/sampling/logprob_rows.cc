#include "common/sampling/logprob_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/status_macros.h"
#include "common/sampling/staging.h"

namespace specd {

using sampling_internal::EnqueueAndWait;
using sampling_internal::Ensure;
using sampling_internal::Get;
using sampling_internal::Layout;
using sampling_internal::Put;

float ProcessedLogprob(float p) {
  if (!(p > 0.0f)) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(std::log(static_cast<double>(p)));
}

void LogprobRows::Clear() {
  rows_.clear();
  query_rows_.clear();
  query_tokens_.clear();
  max_top_n_ = 0;
}

int32_t LogprobRows::AddRow(Logits logits, int32_t top_n, int32_t processed_slot) {
  rows_.push_back({logits, top_n, processed_slot});
  max_top_n_ = std::max(max_top_n_, top_n);
  return static_cast<int32_t>(rows_.size() - 1);
}

int32_t LogprobRows::AddQuery(int32_t row, int32_t token) {
  query_rows_.push_back(row);
  query_tokens_.push_back(token);
  return static_cast<int32_t>(query_rows_.size() - 1);
}

std::span<const int32_t> LogprobRows::top_ids(int32_t row) const {
  const Row& r = rows_[static_cast<size_t>(row)];
  return std::span<const int32_t>(out_top_ids_)
      .subspan(static_cast<size_t>(row) * static_cast<size_t>(max_top_n_),
               static_cast<size_t>(r.top_n));
}

std::span<const float> LogprobRows::top_logprobs(int32_t row) const {
  const Row& r = rows_[static_cast<size_t>(row)];
  return std::span<const float>(out_top_logprobs_)
      .subspan(static_cast<size_t>(row) * static_cast<size_t>(max_top_n_),
               static_cast<size_t>(r.top_n));
}

absl::Status LogprobRows::Run(RowPool& pool) {
  const size_t n_rows = rows_.size();
  const size_t n_queries = query_rows_.size();
  const size_t n_top = n_rows * static_cast<size_t>(max_top_n_);
  out_top_ids_.assign(n_top, 0);
  out_top_logprobs_.assign(n_top, 0.0f);
  out_queries_.assign(n_queries, 0.0f);
  if (n_rows == 0) return absl::OkStatus();
  const int64_t vocab = pool.vocab();

  // The processed rows' values are gathered from the pool: for the top tokens (whatever the
  // Logprobs op picks, read where it wrote them) and for the queries.
  const bool any_processed =
      std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return r.processed_slot >= 0; });
  std::vector<int32_t> top_slots;
  std::vector<int32_t> query_slots;
  if (any_processed) {
    for (const Row& r : rows_) {
      top_slots.insert(top_slots.end(), static_cast<size_t>(max_top_n_),
                       std::max(r.processed_slot, 0));
    }
    for (const int32_t row : query_rows_) {
      query_slots.push_back(std::max(rows_[static_cast<size_t>(row)].processed_slot, 0));
    }
  }

  Layout layout;
  const int64_t at_query_rows = layout.Take<int32_t>(n_queries);
  const int64_t at_query_tokens = layout.Take<int32_t>(n_queries);
  const int64_t at_top_slots = layout.Take<int32_t>(top_slots.size());
  const int64_t at_query_slots = layout.Take<int32_t>(query_slots.size());
  const int64_t inputs_end = layout.bytes();
  const int64_t at_top_ids = layout.Take<int32_t>(n_top);
  const int64_t at_top_logprobs = layout.Take<float>(n_top);
  const int64_t at_query_logprobs = layout.Take<float>(n_queries);
  const int64_t at_top_probs = layout.Take<float>(top_slots.size());
  const int64_t at_query_probs = layout.Take<float>(query_slots.size());
  const int64_t total = layout.bytes();
  SPECD_RETURN_IF_ERROR(
      Ensure(*backend_, staging_, total, kernels::MemoryKind::kStaging, "logprob inputs"));
  SPECD_RETURN_IF_ERROR(
      Ensure(*backend_, device_, total, kernels::MemoryKind::kScratch, "logprob inputs"));
  SPECD_RETURN_IF_ERROR(Ensure(*backend_, rows_buffer_, static_cast<int64_t>(n_rows) * vocab * 4,
                               kernels::MemoryKind::kScratch, "logprob rows"));

  char* host = staging_.as<char>();
  Put(host, at_query_rows, query_rows_);
  Put(host, at_query_tokens, query_tokens_);
  Put(host, at_top_slots, top_slots);
  Put(host, at_query_slots, query_slots);
  char* dev = device_.as<char>();
  if (inputs_end > 0) SPECD_RETURN_IF_ERROR(backend_->Upload(dev, host, inputs_end));
  const auto i32 = [dev](int64_t at) { return reinterpret_cast<int32_t*>(dev + at); };
  const auto f32 = [dev](int64_t at) { return reinterpret_cast<float*>(dev + at); };

  SPECD_RETURN_IF_ERROR(EnqueueAndWait(*backend_, [&]() -> absl::Status {
    // The Logprobs op reads its rows side by side.
    float* rows = rows_buffer_.as<float>();
    for (size_t r = 0; r < n_rows; ++r) {
      const Logits& src = rows_[r].logits;
      const float* from =
          src.pool_slot >= 0 ? pool.rows() + int64_t{src.pool_slot} * vocab : src.data;
      SPECD_RETURN_IF_ERROR(
          backend_->CopyDeviceToDevice(rows + static_cast<int64_t>(r) * vocab, from, vocab * 4));
    }
    kernels::LogprobsArgs a;
    a.logits = rows;
    a.n_rows = static_cast<int64_t>(n_rows);
    a.vocab = vocab;
    a.top_n = max_top_n_;
    a.top_ids = i32(at_top_ids);
    a.top_logprobs = f32(at_top_logprobs);
    a.query_rows = i32(at_query_rows);
    a.query_tokens = i32(at_query_tokens);
    a.query_logprobs = f32(at_query_logprobs);
    a.n_queries = static_cast<int64_t>(n_queries);
    SPECD_RETURN_IF_ERROR(backend_->Logprobs(a));
    if (any_processed) {
      kernels::GatherProbsArgs g;
      g.probs = pool.rows();
      g.prob_capacity = pool.capacity();
      g.vocab = vocab;
      if (n_top > 0) {
        g.slots = i32(at_top_slots);
        g.tokens = i32(at_top_ids);  // written by the Logprobs op just enqueued
        g.out = f32(at_top_probs);
        g.n = static_cast<int64_t>(n_top);
        SPECD_RETURN_IF_ERROR(backend_->GatherProbs(g));
      }
      if (n_queries > 0) {
        g.slots = i32(at_query_slots);
        g.tokens = i32(at_query_tokens);
        g.out = f32(at_query_probs);
        g.n = static_cast<int64_t>(n_queries);
        SPECD_RETURN_IF_ERROR(backend_->GatherProbs(g));
      }
    }
    SPECD_RETURN_IF_ERROR(
        backend_->Download(host + inputs_end, dev + inputs_end, total - inputs_end));
    return absl::OkStatus();
  }));
  Get(host, at_top_ids, out_top_ids_);
  Get(host, at_top_logprobs, out_top_logprobs_);
  Get(host, at_query_logprobs, out_queries_);
  if (!any_processed) return absl::OkStatus();
  std::vector<float> top_probs(top_slots.size());
  std::vector<float> query_probs(query_slots.size());
  Get(host, at_top_probs, top_probs);
  Get(host, at_query_probs, query_probs);
  for (size_t r = 0; r < n_rows; ++r) {
    if (rows_[r].processed_slot < 0) continue;
    for (size_t j = 0; j < static_cast<size_t>(rows_[r].top_n); ++j) {
      const size_t at = r * static_cast<size_t>(max_top_n_) + j;
      out_top_logprobs_[at] = ProcessedLogprob(top_probs[at]);
    }
  }
  for (size_t q = 0; q < n_queries; ++q) {
    if (rows_[static_cast<size_t>(query_rows_[q])].processed_slot < 0) continue;
    out_queries_[q] = ProcessedLogprob(query_probs[q]);
  }
  return absl::OkStatus();
}

}  // namespace specd
