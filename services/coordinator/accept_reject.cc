#include "services/coordinator/accept_reject.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/inverse_cdf.h"
#include "base/philox.h"

namespace specd {

int32_t CountAccepted(const RoundEvidence& round, bool greedy) {
  const size_t K = round.draft_tokens.size();
  for (size_t i = 0; i < K; ++i) {
    if (greedy) {
      if (round.draft_tokens[i] != round.target_argmax[i]) return static_cast<int32_t>(i);
      continue;
    }
    const double u = StreamUniform(round.seed, round.position + static_cast<uint32_t>(i),
                                   Purpose::kAccept, 0, round.sample);
    // Compared in double: both probabilities are exact fp32 values, so this is the exact test.
    if (!(u * static_cast<double>(round.q_draft[i]) < static_cast<double>(round.p_draft[i]))) {
      return static_cast<int32_t>(i);
    }
  }
  return static_cast<int32_t>(K);
}

std::optional<int32_t> ChooseCandidate(uint64_t seed, uint32_t sample, uint32_t position_r,
                                       std::span<const int32_t> candidates,
                                       std::span<const float> p_candidates,
                                       std::span<const float> q_candidates) {
  const size_t m = std::min({candidates.size(), p_candidates.size(), q_candidates.size()});
  for (size_t j = 0; j < m; ++j) {
    const float p = p_candidates[j];
    // The residual's numerator in fp32, as SampleResidual computes it.
    const float residual = p - std::min(p, q_candidates[j]);
    const double w = StreamUniform(seed, position_r, Purpose::kCandidateAccept,
                                   static_cast<uint32_t>(j), sample);
    if (w * static_cast<double>(p) < static_cast<double>(residual)) return candidates[j];
  }
  return std::nullopt;
}

absl::StatusOr<int32_t> SampleResidual(uint64_t seed, uint32_t sample, uint32_t position_r,
                                       const ProbRow& p, const ProbRow& q, int64_t vocab_size) {
  absl::StatusOr<std::vector<float>> pd = DensifyRow(p, vocab_size, "target");
  if (!pd.ok()) return pd.status();
  absl::StatusOr<std::vector<float>> qd = DensifyRow(q, vocab_size, "draft");
  if (!qd.ok()) return qd.status();
  std::vector<float> residual(static_cast<size_t>(vocab_size));
  float total = 0.0f;
  for (size_t i = 0; i < residual.size(); ++i) {
    residual[i] = (*pd)[i] - std::min((*pd)[i], (*qd)[i]);
    total += residual[i];
  }
  const double u = StreamUniform(seed, position_r, Purpose::kResidualFallback, 0, sample);
  // p_r and q_r can be equal (e.g. the draft reproduced the target exactly) so the residual is 0;
  // then any rejection had probability 0 and p_r is the exact answer.
  return SampleInverseCdf(total > 0.0f ? residual : *pd, u);
}

}  // namespace specd
