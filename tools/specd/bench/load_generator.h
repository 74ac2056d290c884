// The load half of `specd bench`: sends a list of Generate requests over N concurrent streams,
// either in a closed loop (each stream sends its next request as soon as its last one ends) or
// at a fixed request rate (Poisson or evenly spaced arrivals, at most N in flight), and records
// when every token-bearing message arrived.
#ifndef SPECD_TOOLS_SPECD_BENCH_LOAD_GENERATOR_H_
#define SPECD_TOOLS_SPECD_BENCH_LOAD_GENERATOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd::bench {

enum class Arrival { kPoisson, kFixedInterval };

// "poisson" or "fixed"; INVALID_ARGUMENT names --arrival otherwise.
absl::StatusOr<Arrival> ParseArrival(const std::string& name);

// Send times, in seconds from the start of a run, of `n` requests at `rate` requests/s: gaps
// drawn from Exp(rate) (a Poisson process, as vLLM's benchmark_serving does) with a generator
// seeded by `seed`, or exactly 1/rate apart. The first request goes at 0. rate <= 0 means all at
// 0 (closed loop).
std::vector<double> ArrivalOffsets(int64_t n, double rate, Arrival arrival, uint64_t seed);

struct LoadOptions {
  int64_t streams = 1;  // requests in flight at most
  double rate = 0;      // requests/s; 0 = closed loop
  Arrival arrival = Arrival::kPoisson;
  uint64_t arrival_seed = 0;
  double timeout_seconds = 600;  // per request
};

// One request as the client saw it. Times are seconds since the start of the run.
struct RequestOutcome {
  int64_t index = 0;  // in the request list
  double start_s = 0;
  double end_s = 0;
  std::vector<double> message_s;        // arrival of each message that carried tokens
  std::vector<int32_t> message_tokens;  // tokens in each of those messages
  int64_t output_tokens = 0;            // tokens received
  std::vector<int32_t> token_ids;       // the tokens received, in order
  bool has_usage = false;
  v1::Usage usage;  // from the last message
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  absl::Status status;  // the call's status, naming the request on failure
};

struct LoadRun {
  double wall_s = 0;                     // first request sent to last response finished
  std::vector<RequestOutcome> outcomes;  // in request-list order
};

// Sends one request over the gRPC API and waits for its stream to end; times are seconds since
// `run_start`. `on_first_tokens` (optional) runs when the first message with tokens arrives.
RequestOutcome RunRequest(v1::Generation::StubInterface& stub, const v1::GenerateRequest& request,
                          int64_t index, double timeout_seconds,
                          std::chrono::steady_clock::time_point run_start,
                          const std::function<void()>& on_first_tokens = {});

// Sends request number `index` and records it, with times in seconds since `run_start`.
using SendOne = std::function<RequestOutcome(const v1::GenerateRequest& request, int64_t index,
                                             double timeout_seconds,
                                             std::chrono::steady_clock::time_point run_start)>;

// Runs `requests` with `send` (called from up to options.streams threads at once) and returns
// every outcome (failed requests included, with their status). `on_done` is called, serialised,
// after each request ends.
LoadRun RunLoad(const SendOne& send, const std::vector<v1::GenerateRequest>& requests,
                const LoadOptions& options, const std::function<void()>& on_done);

// The same over the gRPC API.
LoadRun RunLoad(v1::Generation::StubInterface& stub,
                const std::vector<v1::GenerateRequest>& requests, const LoadOptions& options,
                const std::function<void()>& on_done);

}  // namespace specd::bench

#endif  // SPECD_TOOLS_SPECD_BENCH_LOAD_GENERATOR_H_
