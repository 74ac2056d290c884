// The HTTP half of `specd bench --http`: a Generate request sent as the equivalent streamed
// OpenAI request (POST /v1/completions with stream_options.include_usage and return_token_ids)
// and recorded like a gRPC one: every event that carries tokens is a message, and the usage
// chunk is the Usage. So the two APIs are measured by the same statistics.
#ifndef SPECD_TOOLS_SPECD_BENCH_HTTP_LOAD_H_
#define SPECD_TOOLS_SPECD_BENCH_HTTP_LOAD_H_

#include <chrono>
#include <cstdint>

#include "nlohmann/json.hpp"
#include "specd/v1/generation.pb.h"
#include "tools/specd/bench/load_generator.h"

namespace specd::bench {

// The /v1/completions body equivalent to `request` (prompt, sampling, stopping, K and policy).
nlohmann::json CompletionBody(const v1::GenerateRequest& request);

// Sends `request` to the HTTP API at 127.0.0.1:`port` on a new connection and records it.
RequestOutcome RunOneHttp(int port, const v1::GenerateRequest& request, int64_t index,
                          double timeout_seconds, std::chrono::steady_clock::time_point run_start);

}  // namespace specd::bench

#endif  // SPECD_TOOLS_SPECD_BENCH_HTTP_LOAD_H_
