// Log-probabilities of the target's rows for the logprobs of the public APIs (issue 15), computed
// on the back end from rows already in its memory: the penalised logits of a pass (RowSampler
// keeps them when asked) or rows kept in the RowPool. Only the top-N and the queried tokens come
// back to the host, never a row.
//
// Two definitions (LogprobsMode in common/protocol/worker_protocol.h):
//  * raw: the Logprobs op over the penalised logits (vLLM's default);
//  * processed: the processed row's own values, fl32(log(fp64 p)), -inf where p is 0. Its top-N
//    are the raw top-N's tokens, since every transform after the penalties keeps their order
//    (temperature scales, truncation cuts the tail, renormalisation divides by one sum).
//
// Usage: Clear, AddRow/AddQuery, Run, then read by the indices they returned.
#ifndef SPECD_COMMON_SAMPLING_LOGPROB_ROWS_H_
#define SPECD_COMMON_SAMPLING_LOGPROB_ROWS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/sampling/row_pool.h"
#include "kernels/backend.h"

namespace specd {

// log(p) of a processed probability as the processed logprobs report it: fl32(log(fp64 p)), and
// -inf for p = 0. The coordinator uses it too (for a row it read with ReadRows).
float ProcessedLogprob(float p);

class LogprobRows {
 public:
  // Where a row's penalised logits are: a back-end pointer valid until Run returns, or a slot of
  // the RowPool passed to Run (resolved there, since the pool may move as it grows).
  struct Logits {
    const float* data = nullptr;
    int32_t pool_slot = -1;
  };

  explicit LogprobRows(kernels::Backend& backend) : backend_(&backend) {}

  void Clear();

  // A row with its top `top_n` (<= kernels::kMaxTopLogprobs). `processed_slot` >= 0 asks for the
  // processed values of that pool row instead of the raw ones. Returns the row's index.
  int32_t AddRow(Logits logits, int32_t top_n, int32_t processed_slot);
  // The logprob of `token` in row `row`. Returns its index for query().
  int32_t AddQuery(int32_t row, int32_t token);

  // Copies the rows together, enqueues Logprobs (and GatherProbs for processed rows), downloads
  // the results and synchronizes the back end.
  absl::Status Run(RowPool& pool);

  std::span<const int32_t> top_ids(int32_t row) const;
  std::span<const float> top_logprobs(int32_t row) const;
  float query(int32_t i) const { return out_queries_[static_cast<size_t>(i)]; }

 private:
  struct Row {
    Logits logits;
    int32_t top_n = 0;
    int32_t processed_slot = -1;
  };

  kernels::Backend* backend_;
  std::vector<Row> rows_;
  std::vector<int32_t> query_rows_;
  std::vector<int32_t> query_tokens_;
  int32_t max_top_n_ = 0;
  // Results: [rows, max_top_n_] and [queries].
  std::vector<int32_t> out_top_ids_;
  std::vector<float> out_top_logprobs_;
  std::vector<float> out_queries_;
  kernels::Buffer rows_buffer_;  // the rows side by side, [rows, vocab]
  kernels::Buffer staging_;
  kernels::Buffer device_;
};

}  // namespace specd

#endif  // SPECD_COMMON_SAMPLING_LOGPROB_ROWS_H_
