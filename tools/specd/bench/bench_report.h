// What `specd bench` makes of its runs: a summary per arm (one K value and policy, over all its
// repeats), the --compare rows that set each K arm against the K = 0 arm, and their rendering as
// a text table and as JSON.
#ifndef SPECD_TOOLS_SPECD_BENCH_BENCH_REPORT_H_
#define SPECD_TOOLS_SPECD_BENCH_BENCH_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/specd/bench/bench_stats.h"
#include "tools/specd/bench/load_generator.h"

namespace specd::bench {

// Classifier-free guidance of an arm's requests: none, the target's (the draft drafts unguided),
// or both models' (guidance.draft).
enum class ArmGuidance { kOff, kTarget, kTargetAndDraft };

// One arm of a benchmark: every request of it asks for K drafts with one policy, one way of
// drafting and one guidance.
struct ArmSpec {
  int32_t k = 0;
  bool adaptive = false;       // K_POLICY_ADAPTIVE (the server may lower K) instead of FIXED
  bool http = false;           // over the OpenAI-compatible HTTP API instead of gRPC
  bool ngram = false;          // DRAFT_METHOD_NGRAM (prompt lookup) instead of the server's default
  int32_t tree_branching = 0;  // a draft tree of this branching and depth (0: a chain)
  int32_t tree_depth = 0;
  std::optional<bool> egag = std::nullopt;  // speculation.egag; unset: the server's default
  ArmGuidance guidance = ArmGuidance::kOff;

  // "K=4", "K=4 adaptive", "K=4 http", "K=4 tree 2x2", "K=4 ngram", "K=4 egag", "K=4 cfg",
  // "K=4 cfg+draft"
  std::string Label() const;
  bool operator==(const ArmSpec&) const = default;
};

struct ArmSummary {
  ArmSpec arm;
  int64_t requests = 0;  // over all repeats
  int64_t failed = 0;
  std::string first_error;
  int64_t output_tokens = 0;  // tokens the client received
  int64_t prompt_tokens = 0;  // from Usage
  std::map<std::string, int64_t> finish_reasons;
  // Client-side throughput of each repeat: output tokens (requests) / the repeat's wall time.
  std::vector<double> repeat_wall_s;
  std::vector<double> repeat_output_tokens_per_s;
  std::vector<double> repeat_requests_per_s;
  // Medians of the above over the repeats.
  std::optional<double> output_tokens_per_s;
  std::optional<double> requests_per_s;
  // Latencies in ms, pooled over the repeats' successful requests, as vLLM's benchmark_serving
  // defines them. TTFT: request sent to the first message with tokens. ITL: the gap between two
  // consecutive token-bearing messages of a request, one sample per message, however many tokens
  // it carries. TPOT: (end-to-end latency - TTFT) / (output tokens - 1), per request with more
  // than one token. E2E: request sent to its stream's end.
  Distribution ttft_ms, itl_ms, tpot_ms, e2e_ms;
  AcceptanceTotals acceptance_totals;
  AcceptanceStats acceptance;
  TimingTotals timing_totals;
  StepTimes steps;
};

// Summarises the repeats of one arm. Failed requests count in `failed` only.
ArmSummary SummarizeArm(const ArmSpec& arm, std::span<const LoadRun> repeats);

// One K arm against the K = 0 arm of the same run.
struct CompareRow {
  ArmSpec arm;
  // The K the predictions use: the requested K under a fixed policy; under an adaptive one, the
  // K rounds really drafted on average (draft_steps / rounds), which makes them approximate.
  double k = 0;
  std::optional<double> alpha;                 // see AcceptanceStats::alpha
  std::optional<double> target_step_ms;        // T_t, from the K = 0 arm
  std::optional<double> draft_step_ms;         // T_d
  std::optional<double> verify_step_ms;        // T_v(K)
  std::optional<double> verify_to_target;      // T_v(K) / T_t
  std::optional<double> draft_to_target;       // T_d / T_t
  std::optional<double> expected_tokens;       // E[tokens] = (1 - α^(K+1)) / (1 - α)
  std::optional<double> mean_accepted_length;  // measured tokens per round
  std::optional<double> ideal;                 // IdealSpeedup
  std::optional<double> engine_limited;        // EngineLimitedSpeedup
  std::optional<double> measured;              // median tok/s of this arm / of the K = 0 arm
  std::optional<double> efficiency;            // measured / engine_limited
};

CompareRow CompareArm(const ArmSummary& baseline, const ArmSummary& arm);

// One arm over HTTP against the same arm over gRPC, run alternately in one benchmark: what the
// HTTP API adds per output token, and its throughput at the run's stream count.
struct TransportRow {
  ArmSpec arm;                                                 // the gRPC arm
  std::optional<double> grpc_tpot_ms, http_tpot_ms;            // mean TPOT
  std::optional<double> added_ms_per_token;                    // http_tpot_ms - grpc_tpot_ms
  std::optional<double> grpc_itl_ms, http_itl_ms;              // mean ITL
  std::optional<double> grpc_ttft_ms, http_ttft_ms;            // median TTFT
  std::optional<double> grpc_tokens_per_s, http_tokens_per_s;  // median output tok/s
  std::optional<double> throughput_ratio;                      // http / grpc
};

TransportRow CompareTransport(const ArmSummary& grpc, const ArmSummary& http);

// A guided arm against the unguided arm of the same K, policy and API in the same run.
struct GuidanceRow {
  ArmSpec arm;
  std::optional<double> tokens_per_s, unguided_tokens_per_s;
  std::optional<double> throughput_ratio;  // median tok/s guided / unguided
  std::optional<double> alpha, unguided_alpha;
};

// One row per guided arm that has an unguided counterpart in `arms`.
std::vector<GuidanceRow> CompareGuidance(std::span<const ArmSummary> arms);

// The human-readable report (stdout). `compare`, `transport` and `guidance` may be empty.
std::string FormatReport(std::span<const ArmSummary> arms, std::span<const CompareRow> compare,
                         int64_t repeats, std::span<const TransportRow> transport = {},
                         std::span<const GuidanceRow> guidance = {});

nlohmann::ordered_json ArmToJson(const ArmSummary& arm);
nlohmann::ordered_json CompareToJson(const CompareRow& row);
nlohmann::ordered_json TransportToJson(const TransportRow& row, int64_t streams);
nlohmann::ordered_json GuidanceToJson(const GuidanceRow& row);

}  // namespace specd::bench

#endif  // SPECD_TOOLS_SPECD_BENCH_BENCH_REPORT_H_
