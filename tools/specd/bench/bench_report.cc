#include "tools/specd/bench/bench_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd::bench {
namespace {

constexpr double kMsPerS = 1e3;

std::string Fmt(const std::optional<double>& v, int decimals = 2) {
  return v ? absl::StrFormat("%.*f", decimals, *v) : std::string("-");
}

std::string Percent(const std::optional<double>& v) {
  return v ? absl::StrFormat("%.1f%%", 100 * *v) : std::string("-");
}

std::string Triple(const Distribution& d) {
  return absl::StrCat(Fmt(d.p50, 1), "/", Fmt(d.p90, 1), "/", Fmt(d.p99, 1));
}

nlohmann::ordered_json Opt(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json DistributionJson(const Distribution& d) {
  return {{"count", d.count},
          {"mean", Opt(d.mean)},
          {"p50", Opt(d.p50)},
          {"p90", Opt(d.p90)},
          {"p99", Opt(d.p99)}};
}

}  // namespace

std::string ArmSpec::Label() const {
  std::string label = absl::StrCat("K=", k, adaptive && k > 0 ? " adaptive" : "");
  if (k > 0) {
    if (ngram) absl::StrAppend(&label, " ngram");
    if (tree_branching > 0) absl::StrAppend(&label, " tree ", tree_branching, "x", tree_depth);
    if (egag.has_value()) absl::StrAppend(&label, *egag ? " egag" : " no-egag");
  }
  if (http) absl::StrAppend(&label, " http");
  if (guidance == ArmGuidance::kTarget) absl::StrAppend(&label, " cfg");
  if (guidance == ArmGuidance::kTargetAndDraft) absl::StrAppend(&label, " cfg+draft");
  return label;
}

namespace {

const char* GuidanceName(ArmGuidance g) {
  switch (g) {
    case ArmGuidance::kTarget:
      return "target";
    case ArmGuidance::kTargetAndDraft:
      return "target_and_draft";
    case ArmGuidance::kOff:
      break;
  }
  return "off";
}

}  // namespace

std::vector<GuidanceRow> CompareGuidance(std::span<const ArmSummary> arms) {
  std::vector<GuidanceRow> rows;
  for (const ArmSummary& a : arms) {
    if (a.arm.guidance == ArmGuidance::kOff) continue;
    ArmSpec unguided = a.arm;
    unguided.guidance = ArmGuidance::kOff;
    for (const ArmSummary& b : arms) {
      if (b.arm != unguided) continue;
      GuidanceRow r;
      r.arm = a.arm;
      r.tokens_per_s = a.output_tokens_per_s;
      r.unguided_tokens_per_s = b.output_tokens_per_s;
      if (a.output_tokens_per_s && b.output_tokens_per_s && *b.output_tokens_per_s > 0) {
        r.throughput_ratio = *a.output_tokens_per_s / *b.output_tokens_per_s;
      }
      r.alpha = a.acceptance.alpha;
      r.unguided_alpha = b.acceptance.alpha;
      rows.push_back(r);
    }
  }
  return rows;
}

ArmSummary SummarizeArm(const ArmSpec& arm, std::span<const LoadRun> repeats) {
  ArmSummary s;
  s.arm = arm;
  std::vector<double> ttft, itl, tpot, e2e;
  for (const LoadRun& run : repeats) {
    int64_t ok_requests = 0, ok_tokens = 0;
    for (const RequestOutcome& o : run.outcomes) {
      ++s.requests;
      if (!o.status.ok()) {
        if (s.failed++ == 0) s.first_error = std::string(o.status.message());
        continue;
      }
      ++ok_requests;
      ok_tokens += o.output_tokens;
      s.output_tokens += o.output_tokens;
      ++s.finish_reasons[v1::FinishReason_Name(o.finish_reason)];
      const double latency = o.end_s - o.start_s;
      e2e.push_back(latency * kMsPerS);
      if (!o.message_s.empty()) {
        const double first = o.message_s.front() - o.start_s;
        ttft.push_back(first * kMsPerS);
        for (size_t i = 1; i < o.message_s.size(); ++i) {
          itl.push_back((o.message_s[i] - o.message_s[i - 1]) * kMsPerS);
        }
        if (o.output_tokens > 1) {
          tpot.push_back((latency - first) / static_cast<double>(o.output_tokens - 1) * kMsPerS);
        }
      }
      if (o.has_usage) {
        const v1::Usage& u = o.usage;
        s.prompt_tokens += u.prompt_tokens();
        const std::vector<int64_t> per_position(u.accepted_per_position().begin(),
                                                u.accepted_per_position().end());
        s.acceptance_totals.Add(u.rounds(), u.drafting_rounds(), u.draft_tokens(),
                                u.accepted_tokens(), per_position);
        const v1::RoundTimings& t = u.timings();
        s.timing_totals.Add(t.rounds(), t.draft_steps(), static_cast<int64_t>(t.draft_forward_ns()),
                            static_cast<int64_t>(t.verify_forward_ns()),
                            static_cast<int64_t>(t.round_ns()));
      }
    }
    s.repeat_wall_s.push_back(run.wall_s);
    const double wall = run.wall_s > 0 ? run.wall_s : 1e-9;
    s.repeat_output_tokens_per_s.push_back(static_cast<double>(ok_tokens) / wall);
    s.repeat_requests_per_s.push_back(static_cast<double>(ok_requests) / wall);
  }
  s.output_tokens_per_s = Median(s.repeat_output_tokens_per_s);
  s.requests_per_s = Median(s.repeat_requests_per_s);
  s.ttft_ms = Summarize(ttft);
  s.itl_ms = Summarize(itl);
  s.tpot_ms = Summarize(tpot);
  s.e2e_ms = Summarize(e2e);
  s.acceptance = ComputeAcceptance(s.acceptance_totals);
  s.steps = ComputeStepTimes(s.timing_totals);
  return s;
}

CompareRow CompareArm(const ArmSummary& baseline, const ArmSummary& arm) {
  CompareRow r;
  r.arm = arm.arm;
  r.k = arm.arm.k;
  if (arm.arm.adaptive && arm.steps.mean_k) r.k = *arm.steps.mean_k;
  r.alpha = arm.acceptance.alpha;
  r.mean_accepted_length = arm.acceptance.mean_accepted_length;
  r.target_step_ms = baseline.steps.verify_ms;
  r.draft_step_ms = arm.steps.draft_step_ms;
  r.verify_step_ms = arm.steps.verify_ms;
  if (r.verify_step_ms && r.target_step_ms && *r.target_step_ms > 0) {
    r.verify_to_target = *r.verify_step_ms / *r.target_step_ms;
  }
  if (r.draft_step_ms && r.target_step_ms && *r.target_step_ms > 0) {
    r.draft_to_target = *r.draft_step_ms / *r.target_step_ms;
  }
  if (r.alpha) {
    r.expected_tokens = ExpectedTokensPerRound(*r.alpha, r.k);
    if (r.target_step_ms && r.draft_step_ms && *r.target_step_ms > 0) {
      r.ideal = IdealSpeedup(*r.alpha, r.k, *r.draft_to_target);
      if (r.verify_step_ms && r.k * *r.draft_step_ms + *r.verify_step_ms > 0) {
        r.engine_limited = EngineLimitedSpeedup(*r.alpha, r.k, *r.target_step_ms, *r.draft_step_ms,
                                                *r.verify_step_ms);
      }
    }
  }
  if (arm.output_tokens_per_s && baseline.output_tokens_per_s &&
      *baseline.output_tokens_per_s > 0) {
    r.measured = *arm.output_tokens_per_s / *baseline.output_tokens_per_s;
  }
  if (r.measured && r.engine_limited && *r.engine_limited > 0) {
    r.efficiency = *r.measured / *r.engine_limited;
  }
  return r;
}

TransportRow CompareTransport(const ArmSummary& grpc, const ArmSummary& http) {
  TransportRow r;
  r.arm = grpc.arm;
  r.grpc_tpot_ms = grpc.tpot_ms.mean;
  r.http_tpot_ms = http.tpot_ms.mean;
  if (r.grpc_tpot_ms && r.http_tpot_ms) r.added_ms_per_token = *r.http_tpot_ms - *r.grpc_tpot_ms;
  r.grpc_itl_ms = grpc.itl_ms.mean;
  r.http_itl_ms = http.itl_ms.mean;
  r.grpc_ttft_ms = grpc.ttft_ms.p50;
  r.http_ttft_ms = http.ttft_ms.p50;
  r.grpc_tokens_per_s = grpc.output_tokens_per_s;
  r.http_tokens_per_s = http.output_tokens_per_s;
  if (r.grpc_tokens_per_s && r.http_tokens_per_s && *r.grpc_tokens_per_s > 0) {
    r.throughput_ratio = *r.http_tokens_per_s / *r.grpc_tokens_per_s;
  }
  return r;
}

std::string FormatReport(std::span<const ArmSummary> arms, std::span<const CompareRow> compare,
                         int64_t repeats, std::span<const TransportRow> transport,
                         std::span<const GuidanceRow> guidance) {
  std::string out;
  absl::StrAppendFormat(&out, "%-13s %6s %5s %10s %7s %20s %20s %20s %7s %7s %9s\n", "arm", "reqs",
                        "fail", "out tok/s", "req/s", "TTFT ms p50/90/99", "ITL ms p50/90/99",
                        "TPOT ms p50/90/99", "accept", "alpha", "tok/round");
  for (const ArmSummary& a : arms) {
    absl::StrAppendFormat(&out, "%-13s %6d %5d %10s %7s %20s %20s %20s %7s %7s %9s\n",
                          a.arm.Label(), a.requests, a.failed, Fmt(a.output_tokens_per_s, 1),
                          Fmt(a.requests_per_s), Triple(a.ttft_ms), Triple(a.itl_ms),
                          Triple(a.tpot_ms), Fmt(a.acceptance.acceptance_rate, 3),
                          Fmt(a.acceptance.alpha, 3), Fmt(a.acceptance.mean_accepted_length));
  }
  bool any_per_position = false;
  for (const ArmSummary& a : arms) any_per_position |= !a.acceptance.per_position.empty();
  if (any_per_position) {
    absl::StrAppend(&out, "\nper-position acceptance (accepted at k / drafting rounds)\n");
    for (const ArmSummary& a : arms) {
      if (a.acceptance.per_position.empty()) continue;
      absl::StrAppendFormat(&out, "  %-13s", a.arm.Label());
      for (const double p : a.acceptance.per_position) absl::StrAppendFormat(&out, " %.3f", p);
      absl::StrAppend(&out, "\n");
    }
  }
  absl::StrAppend(&out,
                  "\nworker step times (Usage.timings; with several streams, whole batches)\n");
  absl::StrAppendFormat(&out, "%-13s %10s %10s %8s %10s %12s %10s\n", "arm", "T_fwd ms", "T_d ms",
                        "mean K", "round ms", "overhead ms", "overhead");
  for (const ArmSummary& a : arms) {
    absl::StrAppendFormat(&out, "%-13s %10s %10s %8s %10s %12s %10s\n", a.arm.Label(),
                          Fmt(a.steps.verify_ms, 3), Fmt(a.steps.draft_step_ms, 3),
                          Fmt(a.steps.mean_k), Fmt(a.steps.round_ms, 3),
                          Fmt(a.steps.overhead_ms, 3), Percent(a.steps.overhead_fraction));
  }
  if (!compare.empty()) {
    absl::StrAppendFormat(&out,
                          "\nspeed-up over K=0 (measured: ratio of median tok/s over %d "
                          "repeat(s); T_t = K=0's T_fwd, T_v(K) = the K arm's)\n",
                          repeats);
    absl::StrAppendFormat(&out, "%-13s %6s %7s %8s %8s %9s %9s %7s %9s %9s %10s\n", "arm", "K",
                          "alpha", "T_v/T_t", "T_d/T_t", "E[tokens]", "tok/round", "ideal",
                          "engine", "measured", "efficiency");
    for (const CompareRow& r : compare) {
      absl::StrAppendFormat(&out, "%-13s %6.2f %7s %8s %8s %9s %9s %7s %9s %9s %10s\n",
                            r.arm.Label(), r.k, Fmt(r.alpha, 3), Fmt(r.verify_to_target, 3),
                            Fmt(r.draft_to_target, 3), Fmt(r.expected_tokens),
                            Fmt(r.mean_accepted_length), Fmt(r.ideal, 3), Fmt(r.engine_limited, 3),
                            Fmt(r.measured, 3), Fmt(r.efficiency, 3));
    }
  }
  if (!transport.empty()) {
    absl::StrAppend(&out,
                    "\nHTTP (OpenAI /v1/completions, streamed) against gRPC, the same requests "
                    "alternating in one run\n");
    absl::StrAppendFormat(&out, "%-13s %13s %13s %12s %13s %13s %10s %10s %8s\n", "arm",
                          "gRPC TPOT ms", "HTTP TPOT ms", "added ms/tok", "gRPC TTFT p50",
                          "HTTP TTFT p50", "gRPC tok/s", "HTTP tok/s", "HTTP/gRPC");
    for (const TransportRow& r : transport) {
      absl::StrAppendFormat(&out, "%-13s %13s %13s %12s %13s %13s %10s %10s %8s\n", r.arm.Label(),
                            Fmt(r.grpc_tpot_ms, 3), Fmt(r.http_tpot_ms, 3),
                            Fmt(r.added_ms_per_token, 3), Fmt(r.grpc_ttft_ms, 2),
                            Fmt(r.http_ttft_ms, 2), Fmt(r.grpc_tokens_per_s, 1),
                            Fmt(r.http_tokens_per_s, 1), Fmt(r.throughput_ratio, 3));
    }
  }
  if (!guidance.empty()) {
    absl::StrAppendFormat(&out,
                          "\nclassifier-free guidance against the unguided arm of the same K "
                          "(median tok/s over %d repeat(s))\n",
                          repeats);
    absl::StrAppendFormat(&out, "%-13s %10s %10s %8s %7s %9s\n", "arm", "tok/s", "unguided",
                          "ratio", "alpha", "unguided");
    for (const GuidanceRow& r : guidance) {
      absl::StrAppendFormat(&out, "%-13s %10s %10s %8s %7s %9s\n", r.arm.Label(),
                            Fmt(r.tokens_per_s, 1), Fmt(r.unguided_tokens_per_s, 1),
                            Fmt(r.throughput_ratio, 3), Fmt(r.alpha, 3), Fmt(r.unguided_alpha, 3));
    }
  }
  for (const ArmSummary& a : arms) {
    if (a.failed > 0) {
      absl::StrAppendFormat(&out, "\n%s: %d of %d requests failed; first: %s\n", a.arm.Label(),
                            a.failed, a.requests, a.first_error);
    }
  }
  return out;
}

nlohmann::ordered_json ArmToJson(const ArmSummary& a) {
  nlohmann::ordered_json j;
  j["label"] = a.arm.Label();
  j["k"] = a.arm.k;
  j["k_policy"] = a.arm.adaptive ? "K_POLICY_ADAPTIVE" : "K_POLICY_FIXED";
  j["api"] = a.arm.http ? "http" : "grpc";
  j["guidance"] = GuidanceName(a.arm.guidance);
  j["requests"] = a.requests;
  j["failed"] = a.failed;
  if (!a.first_error.empty()) j["first_error"] = a.first_error;
  j["output_tokens"] = a.output_tokens;
  j["prompt_tokens"] = a.prompt_tokens;
  j["finish_reasons"] = a.finish_reasons;
  j["repeat_wall_s"] = a.repeat_wall_s;
  j["repeat_output_tokens_per_s"] = a.repeat_output_tokens_per_s;
  j["repeat_requests_per_s"] = a.repeat_requests_per_s;
  j["output_tokens_per_s"] = Opt(a.output_tokens_per_s);
  j["requests_per_s"] = Opt(a.requests_per_s);
  j["ttft_ms"] = DistributionJson(a.ttft_ms);
  j["itl_ms"] = DistributionJson(a.itl_ms);
  j["tpot_ms"] = DistributionJson(a.tpot_ms);
  j["e2e_latency_ms"] = DistributionJson(a.e2e_ms);
  const AcceptanceTotals& t = a.acceptance_totals;
  j["usage"] = {{"rounds", t.rounds},
                {"drafting_rounds", t.drafting_rounds},
                {"draft_tokens", t.draft_tokens},
                {"accepted_tokens", t.accepted_tokens},
                {"accepted_per_position", t.accepted_per_position}};
  j["acceptance_rate"] = Opt(a.acceptance.acceptance_rate);
  j["alpha"] = Opt(a.acceptance.alpha);
  j["mean_accepted_length"] = Opt(a.acceptance.mean_accepted_length);
  j["per_position_acceptance"] = a.acceptance.per_position;
  const TimingTotals& tt = a.timing_totals;
  j["timings"] = {{"rounds", tt.rounds},
                  {"draft_steps", tt.draft_steps},
                  {"draft_forward_ns", tt.draft_forward_ns},
                  {"verify_forward_ns", tt.verify_forward_ns},
                  {"round_ns", tt.round_ns}};
  j["verify_forward_ms"] = Opt(a.steps.verify_ms);
  j["draft_step_ms"] = Opt(a.steps.draft_step_ms);
  j["mean_k"] = Opt(a.steps.mean_k);
  j["round_ms"] = Opt(a.steps.round_ms);
  j["overhead_ms"] = Opt(a.steps.overhead_ms);
  j["overhead_fraction"] = Opt(a.steps.overhead_fraction);
  return j;
}

nlohmann::ordered_json CompareToJson(const CompareRow& r) {
  return {{"label", r.arm.Label()},
          {"k", r.k},
          {"k_policy", r.arm.adaptive ? "K_POLICY_ADAPTIVE" : "K_POLICY_FIXED"},
          {"alpha", Opt(r.alpha)},
          {"target_step_ms", Opt(r.target_step_ms)},
          {"draft_step_ms", Opt(r.draft_step_ms)},
          {"verify_step_ms", Opt(r.verify_step_ms)},
          {"verify_to_target", Opt(r.verify_to_target)},
          {"draft_to_target", Opt(r.draft_to_target)},
          {"expected_tokens", Opt(r.expected_tokens)},
          {"mean_accepted_length", Opt(r.mean_accepted_length)},
          {"ideal_speedup", Opt(r.ideal)},
          {"engine_limited_speedup", Opt(r.engine_limited)},
          {"measured_speedup", Opt(r.measured)},
          {"efficiency", Opt(r.efficiency)}};
}

nlohmann::ordered_json TransportToJson(const TransportRow& r, int64_t streams) {
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  return {{"k", r.arm.k},
          {"streams", streams},
          {"grpc_tpot_mean_ms", opt(r.grpc_tpot_ms)},
          {"http_tpot_mean_ms", opt(r.http_tpot_ms)},
          {"http_added_ms_per_token", opt(r.added_ms_per_token)},
          {"grpc_itl_mean_ms", opt(r.grpc_itl_ms)},
          {"http_itl_mean_ms", opt(r.http_itl_ms)},
          {"grpc_ttft_p50_ms", opt(r.grpc_ttft_ms)},
          {"http_ttft_p50_ms", opt(r.http_ttft_ms)},
          {"grpc_output_tokens_per_s", opt(r.grpc_tokens_per_s)},
          {"http_output_tokens_per_s", opt(r.http_tokens_per_s)},
          {"http_to_grpc_throughput", opt(r.throughput_ratio)}};
}

nlohmann::ordered_json GuidanceToJson(const GuidanceRow& r) {
  return {{"label", r.arm.Label()},
          {"k", r.arm.k},
          {"guidance", GuidanceName(r.arm.guidance)},
          {"output_tokens_per_s", Opt(r.tokens_per_s)},
          {"unguided_output_tokens_per_s", Opt(r.unguided_tokens_per_s)},
          {"throughput_ratio", Opt(r.throughput_ratio)},
          {"alpha", Opt(r.alpha)},
          {"unguided_alpha", Opt(r.unguided_alpha)}};
}

}  // namespace specd::bench
