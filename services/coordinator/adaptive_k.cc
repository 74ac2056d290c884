#include "services/coordinator/adaptive_k.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace specd {
namespace {

// A steady round feeds each sequence at most 2 catch-up tokens: the target always 1 (the last
// committed token), the draft 1 after a rejection and 2 after a fully accepted round (t_K was
// never fed to it). More means prefill or replay, whose forward time is not a decode cost.
constexpr int64_t kSteadyCatchUpPerSequence = 2;

// An overhead of 0 (round time fully inside forward passes) is still a measurement.
constexpr double kMinOverheadSeconds = 1e-9;

// One hiccup (a descheduled thread, a page-fault storm) must not swing a bucket: once it has a few
// recent measurements a new one counts at most this factor away from the bucket's value. A real
// change of level still gets through in a handful of rounds, and a stale bucket takes any value.
constexpr double kOutlierFactor = 3.0;
constexpr int64_t kOutlierClampAfter = 3;
constexpr int64_t kOutlierClampMaxAge = 4;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Expected tokens committed per sequence and round with K drafts: accepted drafts plus the
// correction or bonus token, Σ_{i=0..K} α^i (Leviathan et al. 2023, Sec. 3.3).
double ExpectedTokens(double alpha, int32_t k) {
  if (alpha >= 1.0 - 1e-12) return k + 1.0;
  return (1.0 - std::pow(alpha, k + 1.0)) / (1.0 - alpha);
}

absl::Status CheckDuration(absl::Duration d, absl::string_view field) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoundObservation.", field, " must be finite and >= 0, got ", absl::FormatDuration(d)));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(int64_t value, absl::string_view field) {
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoundObservation.", field, " must be >= 0, got ", value));
  }
  return absl::OkStatus();
}

// 0 <= value <= bound, where `bound_name` says what bounds it.
absl::Status CheckAtMost(int64_t value, int64_t bound, absl::string_view field,
                         absl::string_view bound_name) {
  SPECD_RETURN_IF_ERROR(CheckNonNegative(value, field));
  if (value > bound) {
    return absl::InvalidArgumentError(absl::StrCat("RoundObservation.", field, " (", value,
                                                   ") exceeds ", bound_name, " (", bound, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

int CostCurve::BucketOf(double n) {
  const int b = static_cast<int>(std::floor(kBucketsPerOctave * std::log2(n)));
  return std::clamp(b, 0, kNumBuckets - 1);
}

void CostCurve::Add(double n, double seconds, int64_t now) {
  if (!std::isfinite(n) || n < 1 || !std::isfinite(seconds) || seconds <= 0) return;
  Bucket& b = buckets_[static_cast<size_t>(BucketOf(n))];
  if (b.count == 0) ++num_buckets_;
  ++b.count;
  const int64_t age = std::max<int64_t>(now - b.updated, 1);
  b.updated = now;
  if (b.count > kOutlierClampAfter && age <= kOutlierClampMaxAge) {
    seconds = std::clamp(seconds, b.seconds / kOutlierFactor, b.seconds * kOutlierFactor);
  }
  // The first measurements are averaged evenly, so a bucket needs no prior.
  const double w = std::max({1.0 - std::pow(1.0 - ema_weight_, static_cast<double>(age)),
                             1.0 / static_cast<double>(b.count)});
  b.n += w * (n - b.n);
  b.seconds += w * (seconds - b.seconds);
}

int64_t CostCurve::Measurements(double n) const {
  if (!std::isfinite(n) || n < 1) return 0;
  return buckets_[static_cast<size_t>(BucketOf(n))].count;
}

std::optional<double> CostCurve::Estimate(double n) const {
  if (!std::isfinite(n) || n < 1 || num_buckets_ == 0) return std::nullopt;
  std::vector<const Bucket*> pts;
  for (const Bucket& b : buckets_) {
    if (b.count > 0) pts.push_back(&b);
  }
  // Buckets cover disjoint ranges of n, so their mean sizes increase strictly.
  auto slope = [](const Bucket& a, const Bucket& b) {
    return (b.seconds - a.seconds) / (b.n - a.n);
  };
  const Bucket& first = *pts.front();
  const Bucket& last = *pts.back();
  if (n <= first.n) {
    if (pts.size() == 1) return first.seconds;
    const double s = std::clamp(slope(first, *pts[1]), 0.0, first.seconds / first.n);
    return first.seconds - s * (first.n - n);
  }
  if (n >= last.n) {
    if (pts.size() == 1) return last.seconds;
    const double s = std::clamp(slope(*pts[pts.size() - 2], last), 0.0, last.seconds / last.n);
    return last.seconds + s * (n - last.n);
  }
  for (size_t i = 1; i < pts.size(); ++i) {
    const Bucket& a = *pts[i - 1];
    const Bucket& b = *pts[i];
    if (n > b.n) continue;
    const double roofline = std::max(a.seconds, b.seconds * n / b.n);
    const double chord = a.seconds + slope(a, b) * (n - a.n);
    return std::min(roofline, chord);
  }
  return last.seconds;  // unreachable: n < last.n
}

std::string CostCurve::DebugString() const {
  std::vector<std::string> parts;
  for (const Bucket& b : buckets_) {
    if (b.count > 0) parts.push_back(absl::StrFormat("%.0f=%.3fms", b.n, b.seconds * 1e3));
  }
  return absl::StrJoin(parts, ",");
}

absl::string_view KChoiceReasonName(KChoiceReason reason) {
  switch (reason) {
    case KChoiceReason::kRequested:
      return "requested";
    case KChoiceReason::kWarmup:
      return "warmup";
    case KChoiceReason::kModel:
      return "model";
    case KChoiceReason::kExplore:
      return "explore";
    case KChoiceReason::kProbe:
      return "probe";
  }
  return "unknown";
}

AdaptiveK::AdaptiveK() : AdaptiveK(AdaptiveKOptions()) {}

AdaptiveK::AdaptiveK(const AdaptiveKOptions& options)
    : options_(options),
      alpha_decay_per_attempt_(std::exp2(-1.0 / options.alpha_half_life_attempts)),
      alpha_decay_per_round_(std::exp2(-1.0 / options.alpha_half_life_rounds)),
      accepted_(options.alpha_prior_weight * options.alpha_prior),
      attempts_(options.alpha_prior_weight),
      verify_(options.cost_ema_weight),
      draft_step_(options.cost_ema_weight),
      overhead_spec_(options.cost_ema_weight),
      overhead_plain_(options.cost_ema_weight) {}

absl::StatusOr<AdaptiveK> AdaptiveK::Create(const AdaptiveKOptions& o) {
  auto bad = [](absl::string_view field, absl::string_view want, double got) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdaptiveKOptions.", field, " must be ", want, ", got ", got));
  };
  // Written as !(in range) so that NaN is rejected too.
  if (!(o.alpha_prior >= 0 && o.alpha_prior < 1)) {
    return bad("alpha_prior", "in [0, 1)", o.alpha_prior);
  }
  if (!(o.alpha_prior_weight > 0 && std::isfinite(o.alpha_prior_weight))) {
    return bad("alpha_prior_weight", "finite and > 0", o.alpha_prior_weight);
  }
  if (!(o.alpha_half_life_attempts > 0 && std::isfinite(o.alpha_half_life_attempts))) {
    return bad("alpha_half_life_attempts", "finite and > 0", o.alpha_half_life_attempts);
  }
  if (!(o.alpha_half_life_rounds > 0 && std::isfinite(o.alpha_half_life_rounds))) {
    return bad("alpha_half_life_rounds", "finite and > 0", o.alpha_half_life_rounds);
  }
  if (!(o.cost_ema_weight > 0 && o.cost_ema_weight <= 1)) {
    return bad("cost_ema_weight", "in (0, 1]", o.cost_ema_weight);
  }
  if (!(o.hysteresis >= 0 && o.hysteresis < 1)) {
    return bad("hysteresis", "in [0, 1)", o.hysteresis);
  }
  if (o.min_steady_rounds < 1) return bad("min_steady_rounds", ">= 1", o.min_steady_rounds);
  if (o.min_alpha_attempts < 0) return bad("min_alpha_attempts", ">= 0", o.min_alpha_attempts);
  if (o.explore_interval < 1) return bad("explore_interval", ">= 1", o.explore_interval);
  if (o.explore_rounds < 1) return bad("explore_rounds", ">= 1", o.explore_rounds);
  if (!(o.explore_budget > 0 && o.explore_budget <= 1)) {
    return bad("explore_budget", "in (0, 1]", o.explore_budget);
  }
  if (o.probe_rounds < 1) return bad("probe_rounds", ">= 1", o.probe_rounds);
  if (o.probe_interval < 1) return bad("probe_interval", ">= 1", o.probe_interval);
  return AdaptiveK(o);
}

absl::Status AdaptiveK::Observe(const RoundObservation& r) {
  SPECD_RETURN_IF_ERROR(CheckNonNegative(r.batch_size, "batch_size"));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(r.draft_catch_up_tokens, "draft_catch_up_tokens"));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(r.draft_steps, "draft_steps"));
  SPECD_RETURN_IF_ERROR(
      CheckAtMost(r.drafting_sequences, r.batch_size, "drafting_sequences", "batch_size"));
  SPECD_RETURN_IF_ERROR(CheckAtMost(r.drafted_tokens, r.verify_tokens, "drafted_tokens",
                                    "verify_tokens (the target verifies every draft)"));
  SPECD_RETURN_IF_ERROR(
      CheckAtMost(r.accepted_tokens, r.drafted_tokens, "accepted_tokens", "drafted_tokens"));
  SPECD_RETURN_IF_ERROR(
      CheckAtMost(r.rejections, r.drafting_sequences, "rejections", "drafting_sequences"));
  // Each rejection is a draft that was not accepted.
  SPECD_RETURN_IF_ERROR(CheckAtMost(r.rejections, r.drafted_tokens - r.accepted_tokens,
                                    "rejections", "drafted_tokens - accepted_tokens"));
  SPECD_RETURN_IF_ERROR(CheckDuration(r.draft_forward, "draft_forward"));
  SPECD_RETURN_IF_ERROR(CheckDuration(r.verify_forward, "verify_forward"));
  SPECD_RETURN_IF_ERROR(CheckDuration(r.round, "round"));

  ++observed_rounds_;
  const std::optional<Planned> planned = std::exchange(planned_, std::nullopt);
  // α per token is P(accept t_i | t_1..t_{i-1} accepted). Drafts after a rejection are never
  // tried, so the maximum-likelihood estimate under i.i.d. acceptance is accepted / (accepted +
  // rejections); vLLM's accepted / drafted would read 0.44 for α = 0.7 at K = 4.
  const double attempts = static_cast<double>(r.accepted_tokens + r.rejections);
  // Time decay stops at the weight of one attempt: the ratio is what matters, and sums decayed
  // towards 0 would underflow after a few thousand rounds without drafts.
  const double round_decay =
      attempts_ * alpha_decay_per_round_ >= 1.0 ? alpha_decay_per_round_ : 1.0;
  const double decay = std::pow(alpha_decay_per_attempt_, attempts) * round_decay;
  accepted_ = accepted_ * decay + static_cast<double>(r.accepted_tokens);
  attempts_ = attempts_ * decay + attempts;
  total_attempts_ += r.accepted_tokens + r.rejections;

  const int64_t verify_catch_up = r.verify_tokens - r.drafted_tokens;
  const bool steady_target =
      r.batch_size > 0 && verify_catch_up <= kSteadyCatchUpPerSequence * r.batch_size;
  const bool drafting = r.drafting_sequences > 0;
  const bool steady_draft =
      !drafting || r.draft_catch_up_tokens <= kSteadyCatchUpPerSequence * r.drafting_sequences;
  const double verify_s = Seconds(r.verify_forward);
  const double draft_s = Seconds(r.draft_forward);
  if (steady_target) verify_.Add(static_cast<double>(r.verify_tokens), verify_s, observed_rounds_);
  if (drafting && steady_draft && r.draft_steps > 0) {
    draft_step_.Add(r.drafting_sequences, draft_s / r.draft_steps, observed_rounds_);
  }
  // Long catch-ups are fed in untimed chunks before the timed pass, so such a round's remainder
  // is not overhead. Nor is that of a round without forward times (a worker that does not report
  // them).
  if (steady_target && steady_draft && verify_s > 0 && (!drafting || draft_s > 0) &&
      r.round > absl::ZeroDuration()) {
    const double overhead = std::max(Seconds(r.round) - verify_s - draft_s, kMinOverheadSeconds);
    (drafting ? overhead_spec_ : overhead_plain_).Add(r.batch_size, overhead, observed_rounds_);
    if (drafting) ++steady_rounds_;
  }

  if (planned && planned->choice.reason == KChoiceReason::kModel && planned->choice.k == 0) {
    zero_seconds_ += Seconds(r.round);
  } else if (planned && planned->choice.reason == KChoiceReason::kExplore) {
    // Measured, not predicted: the round's wall time includes the draft's untimed prefill of
    // every token it missed, which is most of what exploring costs after a long stretch.
    const std::optional<double> at_zero = PredictRoundSeconds(planned->batch_size, 0);
    explore_cost_ =
        explore_cost_.value_or(0.0) + std::max(Seconds(r.round) - at_zero.value_or(0.0), 0.0);
  }
  return absl::OkStatus();
}

double AdaptiveK::alpha() const { return accepted_ / attempts_; }

bool AdaptiveK::Ready() const {
  // Counts that never decay: a long stretch at K' = 0 must not send the model back to warm-up.
  return steady_rounds_ >= options_.min_steady_rounds &&
         total_attempts_ >= options_.min_alpha_attempts && !verify_.empty() &&
         !draft_step_.empty() && !overhead_spec_.empty();
}

std::optional<double> AdaptiveK::PredictRoundSeconds(int32_t batch_size, int32_t k) const {
  if (batch_size < 1 || k < 0) return std::nullopt;
  const double b = batch_size;
  double seconds = 0;
  if (k == 0) {
    const std::optional<double> verify = verify_.Estimate(b);
    // Before any round without drafts, the drafting rounds' overhead stands in. It is the larger
    // of the two (it includes the Draft call and the Truncates), so K' = 0 is not favoured blindly.
    std::optional<double> overhead = overhead_plain_.Estimate(b);
    if (!overhead) overhead = overhead_spec_.Estimate(b);
    if (!verify || !overhead) return std::nullopt;
    seconds = *verify + *overhead;
  } else {
    const std::optional<double> draft = draft_step_.Estimate(b);
    const std::optional<double> verify = verify_.Estimate(b * (k + 1.0));
    const std::optional<double> overhead = overhead_spec_.Estimate(b);
    if (!draft || !verify || !overhead) return std::nullopt;
    seconds = k * *draft + *verify + *overhead;
  }
  if (!(seconds > 0)) return std::nullopt;
  return seconds;
}

std::optional<double> AdaptiveK::PredictGoodput(int32_t batch_size, int32_t k) const {
  const std::optional<double> seconds = PredictRoundSeconds(batch_size, k);
  if (!seconds) return std::nullopt;
  return batch_size * ExpectedTokens(alpha(), k) / *seconds;
}

KChoice AdaptiveK::Choose(int32_t batch_size, int32_t requested_k) {
  const int32_t b = std::max(batch_size, 1);
  const KChoice choice = Plan(b, requested_k);
  planned_ = Planned{choice, b};
  return choice;
}

KChoice AdaptiveK::Plan(int32_t b, int32_t requested_k) {
  if (requested_k <= 0) return {0, KChoiceReason::kRequested};
  ++rounds_since_probe_;
  if (!Ready()) return {requested_k, KChoiceReason::kWarmup};
  if (explore_left_ > 0) {
    --explore_left_;
    return {requested_k, KChoiceReason::kExplore};
  }
  if (probe_left_ > 0) {
    --probe_left_;
    return {0, KChoiceReason::kProbe};
  }

  // Ready() guarantees every cost has data, so every prediction exists; value_or keeps a
  // missing one from ever winning.
  auto goodput = [&](int32_t k) { return PredictGoodput(b, k).value_or(0.0); };
  // From the top down with a strict comparison, so ties keep the larger K.
  int32_t best = requested_k;
  double best_goodput = goodput(requested_k);
  for (int32_t k = requested_k - 1; k >= 0; --k) {
    const double g = goodput(k);
    if (g > best_goodput) {
      best = k;
      best_goodput = g;
    }
  }
  const int32_t previous = current_k_ < 0 ? requested_k : std::min(current_k_, requested_k);
  const int32_t chosen =
      best_goodput > (1.0 + options_.hysteresis) * goodput(previous) ? best : previous;
  current_k_ = chosen;
  chosen_k_by_batch_[b] = chosen;

  if (chosen > 0 && verify_.Measurements(b) < options_.probe_rounds &&
      rounds_since_probe_ >= options_.probe_interval) {
    rounds_since_probe_ = 0;
    probe_left_ = options_.probe_rounds - 1;
    return {0, KChoiceReason::kProbe};
  }
  if (chosen > 0) {
    zero_streak_ = 0;
    return {chosen, KChoiceReason::kModel};
  }
  ++zero_streak_;
  if (!explore_cost_) {
    const std::optional<double> at_k = PredictRoundSeconds(b, requested_k);
    const std::optional<double> at_zero = PredictRoundSeconds(b, 0);
    if (at_k && at_zero) explore_cost_ = options_.explore_rounds * std::max(*at_k - *at_zero, 0.0);
  }
  if (zero_streak_ >= options_.explore_interval &&
      zero_seconds_ * options_.explore_budget >= explore_cost_.value_or(0.0)) {
    zero_streak_ = 0;
    zero_seconds_ = 0;
    explore_cost_ = 0.0;
    explore_left_ = options_.explore_rounds - 1;
    return {requested_k, KChoiceReason::kExplore};
  }
  return {0, KChoiceReason::kModel};
}

AdaptiveKEstimates AdaptiveK::Estimates() const {
  AdaptiveKEstimates e;
  e.alpha = alpha();
  e.alpha_weight = attempts_;
  e.steady_rounds = steady_rounds_;
  e.ready = Ready();
  e.chosen_k_by_batch = chosen_k_by_batch_;
  return e;
}

std::string AdaptiveK::DebugString() const {
  return absl::StrFormat(
      "alpha=%.3f attempts=%.0f steady_rounds=%d ready=%d verify{%s} draft_step{%s} "
      "overhead_spec{%s} overhead_plain{%s}",
      alpha(), attempts_, steady_rounds_, Ready() ? 1 : 0, verify_.DebugString(),
      draft_step_.DebugString(), overhead_spec_.DebugString(), overhead_plain_.DebugString());
}

}  // namespace specd
