// `specd bench --scenario`: workloads for prefix caching and chunked prefill, each run on two
// servers side by side, `a` with the feature and `b` without it, in alternating repeats so that
// drift on a shared machine hits both alike. Prompts are token ids drawn from a fixed seed below
// the servers' vocabulary, so any model serves them, tokenizer or not.
//   shared-prefix  one request caches a long shared prefix; then requests with the prefix and
//                  their own suffix, one at a time: time to first token.
//   burst          requests with a shared prefix no cache holds yet and their own suffix, all at
//                  once (n completions, or users behind one system prompt): time to first token
//                  and the burst's throughput.
//   chat           conversations of several turns, each turn resending the whole history, all
//                  conversations at once: throughput and time to first token.
//   long-prompts   streams decoding while long prompts arrive one after another: the streams'
//                  inter-token latency (and the long prompts' time to first token).
#ifndef SPECD_TOOLS_SPECD_BENCH_SCENARIOS_H_
#define SPECD_TOOLS_SPECD_BENCH_SCENARIOS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "specd/v1/generation.grpc.pb.h"
#include "tools/specd/bench/bench_stats.h"
#include "tools/specd/bench/load_generator.h"

namespace specd::bench {

enum class Scenario { kSharedPrefix, kBurst, kChat, kLongPrompts };

// "shared-prefix", "burst", "chat" or "long-prompts"; INVALID_ARGUMENT names --scenario otherwise.
absl::StatusOr<Scenario> ParseScenario(const std::string& name);
std::string_view ScenarioName(Scenario scenario);

struct ScenarioOptions {
  Scenario scenario = Scenario::kSharedPrefix;
  int64_t vocab_size = 0;  // prompt ids are drawn from [3, vocab_size)
  uint64_t seed = 0;
  int32_t k = 4;  // num_speculative_tokens of every request (K_POLICY_FIXED)
  int64_t repeats = 1;
  double timeout_seconds = 600;
  int64_t max_tokens = 16;  // shared-prefix and burst: per request; chat: per reply;
                            // long-prompts: per long prompt
  // shared-prefix and burst
  int64_t prefix_tokens = 800;
  int64_t suffix_tokens = 64;
  int64_t requests = 8;
  // chat
  int64_t conversations = 8;
  int64_t turns = 6;
  int64_t system_tokens = 160;  // shared by every conversation
  int64_t user_tokens = 48;     // each user turn
  // long-prompts
  int64_t streams = 8;          // decoding streams
  int64_t stream_tokens = 160;  // tokens each stream generates
  int64_t long_prompt_tokens = 800;
  double long_prompt_gap_s = 0.5;  // pause after each long prompt before the next
  // Long prompts in flight at once, each sender sending one after another: a burst of prompts
  // whose prefill chunks meet in the same rounds (what the workers' pass budget bounds).
  int64_t long_prompt_concurrency = 1;
};

// What one server did over all repeats.
struct ScenarioArm {
  std::string label;   // "a" or "b"
  std::string server;  // its address
  // The requests the scenario measures (shared-prefix and burst: the suffixed ones; chat: every
  // turn; long-prompts: the decoding streams), and, for long-prompts, the long prompts.
  std::vector<RequestOutcome> measured;
  std::vector<RequestOutcome> long_prompts;
  std::vector<double> repeat_wall_s;          // chat and burst: each repeat's wall time
  std::vector<int64_t> repeat_output_tokens;  // chat and burst: each repeat's tokens received
  int64_t failed = 0;
  std::string first_error;
};

struct ScenarioSummary {
  std::string label, server;
  int64_t requests = 0, failed = 0, output_tokens = 0;
  Distribution ttft_ms, itl_ms, long_prompt_ttft_ms;
  std::vector<double> repeat_output_tokens_per_s;  // chat and burst
  std::optional<double> output_tokens_per_s;       // chat and burst: median over the repeats
};

ScenarioSummary SummarizeScenarioArm(const ScenarioArm& arm);

// Runs `options.scenario` on both servers; an error only when no request could be sent.
absl::StatusOr<std::vector<ScenarioArm>> RunScenario(v1::Generation::StubInterface& a,
                                                     const std::string& a_address,
                                                     v1::Generation::StubInterface& b,
                                                     const std::string& b_address,
                                                     const ScenarioOptions& options);

// The text report: one row per server, then the ratios a / b of the scenario's headline figures.
std::string FormatScenarioReport(const ScenarioOptions& options,
                                 const std::vector<ScenarioSummary>& arms);
nlohmann::ordered_json ScenarioToJson(const ScenarioOptions& options,
                                      const std::vector<ScenarioSummary>& arms);

}  // namespace specd::bench

#endif  // SPECD_TOOLS_SPECD_BENCH_SCENARIOS_H_
