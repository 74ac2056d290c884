// CoordinatorMetrics: the exposition a scrape sees after known events. Expected values are worked
// out by hand from the inputs (vLLM's definitions), not read back from the code under test.
#include "services/coordinator/coordinator_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

// Parses the text exposition into "name{labels}" -> value; comment lines are skipped.
std::map<std::string, double> ParseExposition(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

double Value(const std::map<std::string, double>& m, const std::string& key) {
  const auto it = m.find(key);
  EXPECT_NE(it, m.end()) << "missing series " << key;
  return it == m.end() ? -1.0 : it->second;
}

TEST(CoordinatorMetricsTest, SpecDecodeCountersFollowVllmDefinitions) {
  CoordinatorMetrics metrics(/*max_position=*/4);
  // 5 rounds at K = 4: rounds accepted 0, 1, 2, 2 and 4 drafts, so n sums to 9; draft 1 was
  // accepted in 4 rounds, draft 2 in 3, draft 3 in 1 and draft 4 in 1.
  RequestMetrics r;
  r.finish_reason = "length";
  r.prompt_tokens = 7;
  r.completion_tokens = 14;  // 9 accepted + 5 corrections/bonus
  r.drafting_rounds = 5;
  r.draft_tokens = 20;
  r.accepted_tokens = 9;
  r.accepted_per_position = {4, 3, 1, 1};
  r.duration = absl::Milliseconds(250);
  metrics.OnRequestFinished(r);
  // A plain-decoding request (K = 0) adds no drafts.
  RequestMetrics plain;
  plain.finish_reason = "eos_token";
  plain.prompt_tokens = 3;
  plain.completion_tokens = 2;
  metrics.OnRequestFinished(plain);

  const std::map<std::string, double> m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_spec_decode_num_drafts_total"), 5);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_draft_tokens_total"), 20);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_total"), 9);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}"), 4);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"}"), 3);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"}"), 1);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"3\"}"), 1);
  EXPECT_EQ(Value(m, "specd_prompt_tokens_total"), 10);
  EXPECT_EQ(Value(m, "specd_generation_tokens_total"), 16);
  EXPECT_EQ(Value(m, "specd_request_success_total{finished_reason=\"length\"}"), 1);
  EXPECT_EQ(Value(m, "specd_request_success_total{finished_reason=\"eos_token\"}"), 1);
  // Accepted length per round: one round each at 0 and 1, two at 2, none at 3, one at 4.
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_count"), 5);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_sum"), 9);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"0\"}"), 1);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"1\"}"), 2);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"2\"}"), 4);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"3\"}"), 4);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"4\"}"), 5);
  // One request with acceptance rate 9/20 = 0.45: in the 0.45 bucket, not the 0.4 one.
  EXPECT_EQ(Value(m, "specd_request_acceptance_rate_count"), 1);
  EXPECT_DOUBLE_EQ(Value(m, "specd_request_acceptance_rate_sum"), 0.45);
  EXPECT_EQ(Value(m, "specd_request_acceptance_rate_bucket{le=\"0.4\"}"), 0);
  EXPECT_EQ(Value(m, "specd_request_duration_seconds_count"), 2);
}

// Issue 17: the realized K of every drafting sequence round, and how many EGAG cut short.
TEST(CoordinatorMetricsTest, RealizedDraftLengthAndEgagStops) {
  CoordinatorMetrics metrics(/*max_position=*/4);
  // Three rounds: a full K = 4, and two that EGAG stopped after 2 and after 1 draft.
  metrics.OnDraftLength(4, false);
  metrics.OnDraftLength(2, true);
  metrics.OnDraftLength(1, true);
  const std::map<std::string, double> m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_spec_decode_draft_length_count"), 3);
  EXPECT_EQ(Value(m, "specd_spec_decode_draft_length_sum"), 7);
  EXPECT_EQ(Value(m, "specd_spec_decode_draft_length_bucket{le=\"0\"}"), 0);
  EXPECT_EQ(Value(m, "specd_spec_decode_draft_length_bucket{le=\"1\"}"), 1);
  EXPECT_EQ(Value(m, "specd_spec_decode_draft_length_bucket{le=\"3\"}"), 2);
  EXPECT_EQ(Value(m, "specd_spec_decode_draft_length_bucket{le=\"4\"}"), 3);
  EXPECT_EQ(Value(m, "specd_spec_decode_egag_early_stops_total"), 2);
}

TEST(CoordinatorMetricsTest, SequenceRoundsDeferredByThePassBudget) {
  CoordinatorMetrics metrics(/*max_position=*/4);
  EXPECT_EQ(Value(ParseExposition(metrics.Text()), "specd_pass_budget_deferred_total"), 0);
  metrics.OnDeferred(3);
  metrics.OnDeferred(1);
  EXPECT_EQ(Value(ParseExposition(metrics.Text()), "specd_pass_budget_deferred_total"), 4);
}

TEST(CoordinatorMetricsTest, SequenceRoundsThatWaitedForASharedPrefix) {
  CoordinatorMetrics metrics(/*max_position=*/4);
  EXPECT_EQ(Value(ParseExposition(metrics.Text()), "specd_prefix_sharing_waits_total"), 0);
  metrics.OnPrefixWait(3);
  metrics.OnPrefixWait(2);
  EXPECT_EQ(Value(ParseExposition(metrics.Text()), "specd_prefix_sharing_waits_total"), 5);
}

TEST(CoordinatorMetricsTest, WorkerUpAndRestarts) {
  CoordinatorMetrics metrics(/*max_position=*/4);
  auto m = ParseExposition(metrics.Text());
  // No draft worker, no series: a dashboard must not read 0 as "down".
  EXPECT_EQ(m.count("specd_worker_up{worker=\"draft\"}"), 0u);
  EXPECT_EQ(Value(m, "specd_worker_restarts_total{worker=\"target\"}"), 0);
  metrics.SetWorkerUp(CoordinatorMetrics::Worker::kTarget, true);
  EXPECT_EQ(Value(ParseExposition(metrics.Text()), "specd_worker_up{worker=\"target\"}"), 1);
  metrics.SetWorkerUp(CoordinatorMetrics::Worker::kTarget, false);
  metrics.OnWorkerRestart(CoordinatorMetrics::Worker::kTarget);
  m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_worker_up{worker=\"target\"}"), 0);
  EXPECT_EQ(Value(m, "specd_worker_restarts_total{worker=\"target\"}"), 1);
  EXPECT_EQ(Value(m, "specd_worker_restarts_total{worker=\"draft\"}"), 0);
  EXPECT_EQ(m.count("specd_worker_up{worker=\"draft\"}"), 0u);
}

// Guided requests are counted by what they guide, and their drafted and accepted tokens apart
// from unguided ones', since an unguided draft of a guided target is accepted less often.
TEST(CoordinatorMetricsTest, GuidanceSplitsTheAcceptanceCountersAndCountsGuidedRequests) {
  CoordinatorMetrics metrics(/*max_position=*/4);
  metrics.OnGuidedRequest(GuidanceKind::kOff);
  metrics.OnGuidedRequest(GuidanceKind::kTarget);
  metrics.OnGuidedRequest(GuidanceKind::kTarget);
  metrics.OnGuidedRequest(GuidanceKind::kTargetAndDraft);
  const auto finish = [&](GuidanceKind g, int64_t drafted, int64_t accepted) {
    RequestMetrics r;
    r.guidance = g;
    r.finish_reason = "length";
    r.completion_tokens = accepted + 1;
    r.drafting_rounds = 1;
    r.draft_tokens = drafted;
    r.accepted_tokens = accepted;
    r.accepted_per_position.assign(static_cast<size_t>(accepted), 1);
    metrics.OnRequestFinished(r);
  };
  finish(GuidanceKind::kOff, 4, 3);
  finish(GuidanceKind::kTarget, 4, 1);
  finish(GuidanceKind::kTarget, 4, 0);
  finish(GuidanceKind::kTargetAndDraft, 4, 2);

  const std::map<std::string, double> m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_guided_requests_total{guidance=\"target\"}"), 2);
  EXPECT_EQ(Value(m, "specd_guided_requests_total{guidance=\"target_and_draft\"}"), 1);
  EXPECT_EQ(m.count("specd_guided_requests_total{guidance=\"off\"}"), 0u);
  const std::string drafted = "specd_spec_decode_num_draft_tokens_by_guidance_total";
  const std::string accepted = "specd_spec_decode_num_accepted_tokens_by_guidance_total";
  EXPECT_EQ(Value(m, drafted + "{guidance=\"off\"}"), 4);
  EXPECT_EQ(Value(m, accepted + "{guidance=\"off\"}"), 3);
  EXPECT_EQ(Value(m, drafted + "{guidance=\"target\"}"), 8);
  EXPECT_EQ(Value(m, accepted + "{guidance=\"target\"}"), 1);
  EXPECT_EQ(Value(m, drafted + "{guidance=\"target_and_draft\"}"), 4);
  EXPECT_EQ(Value(m, accepted + "{guidance=\"target_and_draft\"}"), 2);
  // The totals still count everything.
  EXPECT_EQ(Value(m, "specd_spec_decode_num_draft_tokens_total"), 16);
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_total"), 6);
}

TEST(CoordinatorMetricsTest, PositionsBeyondThePreallocatedOnesAppear) {
  CoordinatorMetrics metrics(/*max_position=*/2);
  RequestMetrics r;
  r.finish_reason = "length";
  r.drafting_rounds = 1;
  r.draft_tokens = 3;
  r.accepted_tokens = 3;
  r.accepted_per_position = {1, 1, 1};
  metrics.OnRequestFinished(r);
  const std::map<std::string, double> m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"}"), 1);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"2\"}"), 0);
  EXPECT_EQ(Value(m, "specd_spec_decode_accepted_length_bucket{le=\"3\"}"), 1);
}

TEST(CoordinatorMetricsTest, ErrorsLatenciesPhasesRpcsAndQueues) {
  CoordinatorMetrics metrics;
  metrics.OnRequestError(absl::StatusCode::kResourceExhausted);
  metrics.OnRequestError(absl::StatusCode::kResourceExhausted);
  metrics.OnRequestError(absl::StatusCode::kCancelled);
  metrics.OnFirstToken(absl::Milliseconds(30));
  metrics.OnTokens(4, absl::Milliseconds(40));  // four tokens at 10 ms each
  metrics.OnRoundPhase(CoordinatorMetrics::Phase::kVerify, absl::Milliseconds(5));
  metrics.OnRpc(CoordinatorMetrics::Worker::kTarget, 100, 2000, absl::Milliseconds(3));
  metrics.OnRpc(CoordinatorMetrics::Worker::kTarget, 50, 10, absl::Milliseconds(1));
  int64_t running = 3;
  metrics.SetQueueSource([&] { return running; }, [] { return int64_t{7}; });

  std::map<std::string, double> m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_request_errors_total{code=\"RESOURCE_EXHAUSTED\"}"), 2);
  EXPECT_EQ(Value(m, "specd_request_errors_total{code=\"CANCELLED\"}"), 1);
  EXPECT_DOUBLE_EQ(Value(m, "specd_time_to_first_token_seconds_sum"), 0.03);
  EXPECT_EQ(Value(m, "specd_inter_token_latency_seconds_count"), 4);
  EXPECT_NEAR(Value(m, "specd_inter_token_latency_seconds_sum"), 0.04, 1e-12);
  EXPECT_EQ(Value(m, "specd_round_phase_duration_seconds_count{phase=\"verify\"}"), 1);
  EXPECT_EQ(Value(m, "specd_round_phase_duration_seconds_count{phase=\"draft\"}"), 0);
  EXPECT_EQ(Value(m, "specd_worker_rpc_request_bytes_total{worker=\"target\"}"), 150);
  EXPECT_EQ(Value(m, "specd_worker_rpc_response_bytes_total{worker=\"target\"}"), 2010);
  EXPECT_EQ(Value(m, "specd_worker_rpc_request_bytes_total{worker=\"draft\"}"), 0);
  EXPECT_EQ(Value(m, "specd_worker_rpc_duration_seconds_count{worker=\"target\"}"), 2);
  EXPECT_EQ(Value(m, "specd_num_requests_running"), 3);
  EXPECT_EQ(Value(m, "specd_num_requests_waiting"), 7);
  running = 1;  // gauges are read at scrape time
  m = ParseExposition(metrics.Text());
  EXPECT_EQ(Value(m, "specd_num_requests_running"), 1);
}

// A plain HTTP/1.0 GET against 127.0.0.1:port, returning the whole response.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(CoordinatorMetricsTest, ServesMetricsOverHttpAndNamesTheFlagWhenItCannotBind) {
  CoordinatorMetrics metrics;
  metrics.OnRequestError(absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  const std::string response = HttpGet(*port, "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("specd_request_errors_total{code=\"INVALID_ARGUMENT\"} 1"));
  EXPECT_THAT(response, HasSubstr("# TYPE specd_spec_decode_num_drafts_total counter"));

  CoordinatorMetrics second;
  const absl::StatusOr<int> clash = second.Serve("127.0.0.1", *port);
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(clash.status().message(), HasSubstr("--metrics-port"));
  EXPECT_THAT(clash.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", *port)));
}

}  // namespace
}  // namespace specd
