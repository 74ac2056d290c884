// What both public APIs (gRPC and HTTP) record about a request's events in the coordinator's
// metrics: time to first token, inter-token latency, and the finished request's counts.
#ifndef SPECD_SERVICES_COORDINATOR_REQUEST_METRICS_H_
#define SPECD_SERVICES_COORDINATOR_REQUEST_METRICS_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/scheduler.h"

namespace specd {

// "length", "eos_token", "stop_token", "stop_string" (the metrics' finish_reason label).
const char* FinishReasonName(FinishReason r);

// A request's clock: latencies are measured where the events leave the scheduler.
struct RequestTiming {
  absl::Time arrival = absl::Now();
  absl::Time last_tokens = absl::InfinitePast();
};

// Which distributions the request's rounds compare (its acceptance is counted by this).
GuidanceKind GuidanceOf(const GenerationRequest& r);

// Records one event of a request that `timing` follows.
void RecordEvent(CoordinatorMetrics& metrics, RequestTiming& timing, GuidanceKind guidance,
                 const GenerationEvent& e);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_REQUEST_METRICS_H_
