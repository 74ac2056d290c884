#include "services/coordinator/request_metrics.h"

namespace specd {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEosToken:
      return "eos_token";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

GuidanceKind GuidanceOf(const GenerationRequest& r) {
  if (!r.guidance.has_value()) return GuidanceKind::kOff;
  return r.guidance->draft ? GuidanceKind::kTargetAndDraft : GuidanceKind::kTarget;
}

void RecordEvent(CoordinatorMetrics& metrics, RequestTiming& timing, GuidanceKind guidance,
                 const GenerationEvent& e) {
  const absl::Time now = absl::Now();
  if (!e.tokens.empty()) {
    if (timing.last_tokens == absl::InfinitePast()) {
      metrics.OnFirstToken(now - timing.arrival);
    } else {
      metrics.OnTokens(static_cast<int64_t>(e.tokens.size()), now - timing.last_tokens);
    }
    timing.last_tokens = now;
  }
  if (!e.error.ok()) {
    metrics.OnRequestError(e.error.code());
  } else if (e.finish != FinishReason::kNone) {
    RequestMetrics r;
    r.guidance = guidance;
    r.finish_reason = FinishReasonName(e.finish);
    r.prompt_tokens = e.usage.prompt_tokens;
    r.completion_tokens = e.usage.completion_tokens;
    r.drafting_rounds = e.usage.drafting_rounds;
    r.draft_tokens = e.usage.draft_tokens;
    r.accepted_tokens = e.usage.accepted_tokens;
    r.accepted_per_position = e.usage.accepted_per_position;
    r.duration = now - timing.arrival;
    metrics.OnRequestFinished(r);
  }
}

}  // namespace specd
