#include "services/coordinator/coordinator_metrics.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "services/common/metrics_exposer.h"

namespace specd {
namespace {

constexpr std::array<const char*, 5> kPhaseNames = {"draft", "verify", "accept", "truncate",
                                                    "overhead"};
constexpr std::array<const char*, 2> kWorkerNames = {"draft", "target"};
constexpr std::array<const char*, kNumGuidanceKinds> kGuidanceNames = {"off", "target",
                                                                       "target_and_draft"};

// Factors of 2 from `first` up to past `last`.
prometheus::Histogram::BucketBoundaries Exponential(double first, double last) {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; first * std::ldexp(1.0, i) < last * 2.0; ++i)
    b.push_back(first * std::ldexp(1.0, i));
  return b;
}

// 0.05 .. 1.0: the per-request acceptance rate is a fraction.
prometheus::Histogram::BucketBoundaries RateBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 1; i <= 20; ++i) b.push_back(i / 20.0);
  return b;
}

// 0 .. 16 accepted drafts per round, one bucket each (K is at most 64, larger ones land in +Inf).
prometheus::Histogram::BucketBoundaries LengthBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i <= 16; ++i) b.push_back(i);
  return b;
}

}  // namespace

// Refreshes the queue gauges from their sources at scrape time, so they are never stale and
// the scheduler needs no hook.
class CoordinatorMetrics::QueueCollectable final : public prometheus::Collectable {
 public:
  explicit QueueCollectable(CoordinatorMetrics* metrics) : metrics_(metrics) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    {
      absl::MutexLock lock(&metrics_->mu_);
      if (metrics_->running_source_) {
        metrics_->running_->Set(static_cast<double>(metrics_->running_source_()));
      }
      if (metrics_->waiting_source_) {
        metrics_->waiting_->Set(static_cast<double>(metrics_->waiting_source_()));
      }
    }
    return metrics_->registry_->Collect();
  }

 private:
  CoordinatorMetrics* metrics_;
};

CoordinatorMetrics::CoordinatorMetrics(int max_position)
    : registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<QueueCollectable>(this)) {
  auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  };
  auto histogram = [&](const char* name, const char* help,
                       prometheus::Histogram::BucketBoundaries buckets) -> prometheus::Histogram& {
    return prometheus::BuildHistogram()
        .Name(name)
        .Help(help)
        .Register(*registry_)
        .Add({}, std::move(buckets));
  };
  num_drafts_ = &counter("specd_spec_decode_num_drafts_total",
                         "Sequence rounds that drafted (K > 0), as vLLM counts drafts");
  num_draft_tokens_ =
      &counter("specd_spec_decode_num_draft_tokens_total", "Draft tokens proposed (sum of K)");
  num_accepted_tokens_ = &counter("specd_spec_decode_num_accepted_tokens_total",
                                  "Draft tokens the target accepted (sum of n)");
  per_pos_family_ = &prometheus::BuildCounter()
                         .Name("specd_spec_decode_num_accepted_tokens_per_pos_total")
                         .Help("Rounds that accepted the draft token at position (0-based)")
                         .Register(*registry_);
  auto& drafted_by_guidance =
      prometheus::BuildCounter()
          .Name("specd_spec_decode_num_draft_tokens_by_guidance_total")
          .Help(
              "Draft tokens proposed, by classifier-free guidance: off, target (the draft "
              "unguided) or target_and_draft")
          .Register(*registry_);
  auto& accepted_by_guidance =
      prometheus::BuildCounter()
          .Name("specd_spec_decode_num_accepted_tokens_by_guidance_total")
          .Help(
              "Draft tokens the target accepted, by classifier-free guidance: off, target (the "
              "draft unguided) or target_and_draft")
          .Register(*registry_);
  auto& guided = prometheus::BuildCounter()
                     .Name("specd_guided_requests_total")
                     .Help(
                         "Requests queued with classifier-free guidance, by what is guided: "
                         "target (the draft unguided) or target_and_draft")
                     .Register(*registry_);
  for (size_t i = 0; i < kNumGuidanceKinds; ++i) {
    const prometheus::Labels labels = {{"guidance", kGuidanceNames[i]}};
    draft_tokens_by_guidance_[i] = &drafted_by_guidance.Add(labels);
    accepted_tokens_by_guidance_[i] = &accepted_by_guidance.Add(labels);
    if (i > 0) guided_requests_[i] = &guided.Add(labels);
  }
  tool_call_replies_ = &counter("specd_tool_call_replies_total",
                                "Chat replies returned as tool calls rather than content");
  tool_calls_ = &counter("specd_tool_calls_total", "Tool calls in those replies");
  acceptance_rate_ = &histogram("specd_request_acceptance_rate",
                                "Accepted / drafted tokens of one finished request", RateBuckets());
  accepted_length_ = &histogram("specd_spec_decode_accepted_length",
                                "Draft tokens accepted in one sequence round", LengthBuckets());
  draft_length_ = &histogram("specd_spec_decode_draft_length",
                             "Realized K (drafts, or a tree's depth) of one sequence round that "
                             "drafted: with EGAG the draft's entropy sets it",
                             LengthBuckets());
  egag_stops_ = &counter("specd_spec_decode_egag_early_stops_total",
                         "Sequence rounds whose draft EGAG stopped before the round's K");
  deferred_ = &counter("specd_pass_budget_deferred_total",
                       "Sequence rounds that waited because the workers' per-pass token budget "
                       "(--max-pass-tokens) was full");
  prefix_waits_ = &counter("specd_prefix_sharing_waits_total",
                           "Sequence rounds that waited for prompt blocks another sequence was "
                           "computing, to take them from the prefix cache instead");
  finished_family_ = &prometheus::BuildCounter()
                          .Name("specd_request_success_total")
                          .Help("Requests that finished, by finish reason")
                          .Register(*registry_);
  errors_family_ = &prometheus::BuildCounter()
                        .Name("specd_request_errors_total")
                        .Help("Requests that failed, by gRPC status code")
                        .Register(*registry_);
  prompt_tokens_ = &counter("specd_prompt_tokens_total", "Prompt tokens of finished requests");
  generation_tokens_ =
      &counter("specd_generation_tokens_total", "Generated tokens of finished requests");
  ttft_ =
      &histogram("specd_time_to_first_token_seconds",
                 "From a request's arrival to its first streamed token", Exponential(1e-3, 60.0));
  itl_ = &histogram("specd_inter_token_latency_seconds",
                    "Time between streamed tokens (a round's tokens share its gap)",
                    Exponential(1e-4, 10.0));
  request_duration_ =
      &histogram("specd_request_duration_seconds", "From a request's arrival to its last event",
                 Exponential(1e-2, 600.0));
  running_ = &prometheus::BuildGauge()
                  .Name("specd_num_requests_running")
                  .Help("Requests in the running batch")
                  .Register(*registry_)
                  .Add({});
  waiting_ = &prometheus::BuildGauge()
                  .Name("specd_num_requests_waiting")
                  .Help("Requests queued for the running batch")
                  .Register(*registry_)
                  .Add({});
  adaptive_k_ = &prometheus::BuildGauge()
                     .Name("specd_adaptive_k")
                     .Help("K the adaptive controller chose for the latest round's batch")
                     .Register(*registry_)
                     .Add({});
  adaptive_alpha_ = &prometheus::BuildGauge()
                         .Name("specd_adaptive_k_alpha")
                         .Help("The adaptive controller's per-token acceptance estimate")
                         .Register(*registry_)
                         .Add({});
  k_choices_family_ = &prometheus::BuildCounter()
                           .Name("specd_adaptive_k_rounds_total")
                           .Help(
                               "Rounds planned by the adaptive K controller, by reason "
                               "(requested, warmup, model, explore, probe)")
                           .Register(*registry_);
  auto& phases = prometheus::BuildHistogram()
                     .Name("specd_round_phase_duration_seconds")
                     .Help("Duration of one phase of a speculation round, by phase")
                     .Register(*registry_);
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    phase_seconds_[i] = &phases.Add({{"phase", kPhaseNames[i]}}, Exponential(1e-5, 30.0));
  }
  auto& rpc_seconds = prometheus::BuildHistogram()
                          .Name("specd_worker_rpc_duration_seconds")
                          .Help("Duration of one RPC to a worker, by worker role")
                          .Register(*registry_);
  auto& sent = prometheus::BuildCounter()
                   .Name("specd_worker_rpc_request_bytes_total")
                   .Help("Serialized request bytes sent to a worker, by worker role")
                   .Register(*registry_);
  auto& received = prometheus::BuildCounter()
                       .Name("specd_worker_rpc_response_bytes_total")
                       .Help("Serialized response bytes received from a worker, by worker role")
                       .Register(*registry_);
  worker_up_family_ = &prometheus::BuildGauge()
                           .Name("specd_worker_up")
                           .Help(
                               "1 while the coordinator can use the worker, 0 while it waits for "
                               "it (crashed, hung, or back computing something else)")
                           .Register(*registry_);
  worker_local_socket_family_ =
      &prometheus::BuildGauge()
           .Name("specd_worker_local_socket")
           .Help(
               "1 while the coordinator makes a round's calls to the worker over its same-host "
               "socket (--local-socket), 0 while over gRPC")
           .Register(*registry_);
  auto& restarts = prometheus::BuildCounter()
                       .Name("specd_worker_restarts_total")
                       .Help(
                           "New worker processes the coordinator recovered to, replaying the "
                           "sequences they had lost")
                       .Register(*registry_);
  for (size_t i = 0; i < kWorkerNames.size(); ++i) {
    const prometheus::Labels labels = {{"worker", kWorkerNames[i]}};
    worker_restarts_[i] = &restarts.Add(labels);
    rpc_seconds_[i] = &rpc_seconds.Add(labels, Exponential(1e-5, 30.0));
    rpc_sent_bytes_[i] = &sent.Add(labels);
    rpc_received_bytes_[i] = &received.Add(labels);
  }
  absl::MutexLock lock(&mu_);
  for (int k = 0; k < max_position; ++k) PositionCounter(static_cast<size_t>(k));
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

absl::StatusOr<int> CoordinatorMetrics::Serve(const std::string& host, int port) {
  absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
      MetricsExposer::Serve(host, port, collectable_);
  if (!exposer.ok()) return exposer.status();
  exposer_ = *std::move(exposer);
  return exposer_->port();
}

void CoordinatorMetrics::SetQueueSource(std::function<int64_t()> running,
                                        std::function<int64_t()> waiting) {
  absl::MutexLock lock(&mu_);
  running_source_ = std::move(running);
  waiting_source_ = std::move(waiting);
}

prometheus::Counter& CoordinatorMetrics::PositionCounter(size_t k) {
  while (per_pos_.size() <= k) {
    per_pos_.push_back(&per_pos_family_->Add({{"position", absl::StrCat(per_pos_.size())}}));
  }
  return *per_pos_[k];
}

void CoordinatorMetrics::OnRequestFinished(const RequestMetrics& r) {
  finished_family_->Add({{"finished_reason", r.finish_reason}}).Increment();
  prompt_tokens_->Increment(static_cast<double>(r.prompt_tokens));
  generation_tokens_->Increment(static_cast<double>(r.completion_tokens));
  request_duration_->Observe(absl::ToDoubleSeconds(r.duration));
  if (r.draft_tokens <= 0) return;
  num_drafts_->Increment(static_cast<double>(r.drafting_rounds));
  num_draft_tokens_->Increment(static_cast<double>(r.draft_tokens));
  num_accepted_tokens_->Increment(static_cast<double>(r.accepted_tokens));
  const size_t g = static_cast<size_t>(r.guidance);
  draft_tokens_by_guidance_[g]->Increment(static_cast<double>(r.draft_tokens));
  accepted_tokens_by_guidance_[g]->Increment(static_cast<double>(r.accepted_tokens));
  acceptance_rate_->Observe(static_cast<double>(r.accepted_tokens) /
                            static_cast<double>(r.draft_tokens));
  // A round that accepted draft k+1 accepted every draft before it, so the rounds that accepted
  // exactly n drafts are per_pos[n-1] - per_pos[n] (per_pos[-1] being every drafting round).
  const std::vector<int64_t>& pp = r.accepted_per_position;
  for (size_t n = 0; n <= pp.size(); ++n) {
    const int64_t at_least = n == 0 ? r.drafting_rounds : pp[n - 1];
    const int64_t more = n < pp.size() ? pp[n] : 0;
    for (int64_t i = 0; i < at_least - more; ++i) accepted_length_->Observe(static_cast<double>(n));
  }
  absl::MutexLock lock(&mu_);
  for (size_t k = 0; k < pp.size(); ++k) {
    if (pp[k] > 0) PositionCounter(k).Increment(static_cast<double>(pp[k]));
  }
}

void CoordinatorMetrics::OnRequestError(absl::StatusCode code) {
  errors_family_->Add({{"code", absl::StatusCodeToString(code)}}).Increment();
}

void CoordinatorMetrics::OnGuidedRequest(GuidanceKind kind) {
  if (kind != GuidanceKind::kOff) guided_requests_[static_cast<size_t>(kind)]->Increment();
}

void CoordinatorMetrics::OnToolCallReply(int64_t calls) {
  tool_call_replies_->Increment();
  tool_calls_->Increment(static_cast<double>(calls));
}

void CoordinatorMetrics::OnFirstToken(absl::Duration since_arrival) {
  ttft_->Observe(absl::ToDoubleSeconds(since_arrival));
}

void CoordinatorMetrics::OnTokens(int64_t tokens, absl::Duration gap) {
  if (tokens <= 0) return;
  const double each = absl::ToDoubleSeconds(gap) / static_cast<double>(tokens);
  for (int64_t i = 0; i < tokens; ++i) itl_->Observe(each);
}

void CoordinatorMetrics::OnKChoice(int32_t k, absl::string_view reason, double alpha) {
  adaptive_k_->Set(k);
  adaptive_alpha_->Set(alpha);
  k_choices_family_->Add({{"reason", std::string(reason)}}).Increment();
}

void CoordinatorMetrics::OnDraftLength(int32_t k, bool entropy_stopped) {
  draft_length_->Observe(k);
  if (entropy_stopped) egag_stops_->Increment();
}

void CoordinatorMetrics::OnDeferred(int64_t sequences) {
  deferred_->Increment(static_cast<double>(sequences));
}

void CoordinatorMetrics::OnPrefixWait(int64_t sequences) {
  prefix_waits_->Increment(static_cast<double>(sequences));
}

void CoordinatorMetrics::SetWorkerUp(Worker worker, bool up) {
  worker_up_family_->Add({{"worker", kWorkerNames[static_cast<size_t>(worker)]}})
      .Set(up ? 1.0 : 0.0);
}

void CoordinatorMetrics::SetWorkerLocalSocket(Worker worker, bool local) {
  worker_local_socket_family_->Add({{"worker", kWorkerNames[static_cast<size_t>(worker)]}})
      .Set(local ? 1.0 : 0.0);
}

void CoordinatorMetrics::OnWorkerRestart(Worker worker) {
  worker_restarts_[static_cast<size_t>(worker)]->Increment();
}

void CoordinatorMetrics::OnRoundPhase(Phase phase, absl::Duration elapsed) {
  phase_seconds_[static_cast<size_t>(phase)]->Observe(absl::ToDoubleSeconds(elapsed));
}

void CoordinatorMetrics::OnRpc(Worker worker, int64_t request_bytes, int64_t response_bytes,
                               absl::Duration elapsed) {
  const size_t w = static_cast<size_t>(worker);
  rpc_seconds_[w]->Observe(absl::ToDoubleSeconds(elapsed));
  rpc_sent_bytes_[w]->Increment(static_cast<double>(request_bytes));
  rpc_received_bytes_[w]->Increment(static_cast<double>(response_bytes));
}

std::string CoordinatorMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(collectable_->Collect());
}

}  // namespace specd
