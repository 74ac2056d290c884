#include "services/coordinator/worker_recovery.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace specd {

bool IsRecoverable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

SupervisedWorker::SupervisedWorker(WorkerApi& inner, const RecoveryOptions& options)
    : inner_(inner), options_(options), name_(inner.Name()), backoff_(options.min_backoff) {}

void SupervisedWorker::Log(const std::string& line) const {
  if (options_.on_event) options_.on_event(line);
}

void SupervisedWorker::MarkDown(const absl::Status& status) {
  // Said again when the cause changes kind: a crashed worker (UNAVAILABLE) may come back as one
  // the coordinator cannot use (FAILED_PRECONDITION), and the operator must learn why.
  const bool news = !down_ || status.code() != last_error_.code();
  last_error_ = status;
  if (news) {
    Log(absl::StrCat(UnavailableError().message(), "; its requests wait up to ",
                     absl::FormatDuration(options_.unavailable_timeout), " for it"));
  }
  if (down_) return;
  down_ = true;
  backoff_ = options_.min_backoff;
  // A crashed worker may be back already; a hung one has just used up a whole call deadline.
  next_probe_ = absl::Now();
}

void SupervisedWorker::Observe(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kUnavailable) {
    MarkDown(status);
  } else {
    last_answer_ = absl::Now();
  }
}

absl::StatusOr<std::vector<SequenceOutcome>> SupervisedWorker::Draft(
    std::span<const DraftSequenceRequest> batch,
    const std::function<void(const DraftStep&)>& on_step) {
  absl::StatusOr<std::vector<SequenceOutcome>> out = inner_.Draft(batch, on_step);
  Observe(out.status());
  return out;
}

absl::StatusOr<std::vector<VerifySequenceResult>> SupervisedWorker::Verify(
    std::span<const VerifySequenceRequest> batch) {
  absl::StatusOr<std::vector<VerifySequenceResult>> out = inner_.Verify(batch);
  Observe(out.status());
  return out;
}

absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> SupervisedWorker::Truncate(
    std::span<const TruncateSequenceRequest> batch) {
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> out = inner_.Truncate(batch);
  Observe(out.status());
  return out;
}

absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> SupervisedWorker::ReadRows(
    std::span<const RowQuery> batch) {
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> out = inner_.ReadRows(batch);
  Observe(out.status());
  return out;
}

absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> SupervisedWorker::QueryLogprobs(
    std::span<const LogprobQuery> batch) {
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> out = inner_.QueryLogprobs(batch);
  Observe(out.status());
  return out;
}

absl::Status SupervisedWorker::Release(SeqId seq) {
  absl::Status status = inner_.Release(seq);
  Observe(status);
  return status;
}

absl::StatusOr<WorkerProbe> SupervisedWorker::Probe(absl::Duration timeout) {
  return inner_.Probe(timeout);
}

absl::Time SupervisedWorker::next_probe() const {
  return down_ || probe_requested_ ? next_probe_ : absl::InfiniteFuture();
}

void SupervisedWorker::ProbeNow(absl::Time now) {
  probe_requested_ = true;
  next_probe_ = now;
  (void)ProbeIfDue(now);
}

void SupervisedWorker::CheckLiveness(absl::Time now) {
  if (down_ || probe_requested_) return;
  if (inner_.Connected() && now - last_answer_ < options_.quiet_probe_interval) return;
  probe_requested_ = true;
  next_probe_ = now;
}

std::optional<SupervisedWorker::Recovery> SupervisedWorker::ProbeIfDue(absl::Time now) {
  if ((!down_ && !probe_requested_) || now < next_probe_) return std::nullopt;
  probe_requested_ = false;
  absl::StatusOr<WorkerProbe> probe = inner_.Probe(options_.probe_timeout);
  if (!probe.ok()) {
    MarkDown(probe.status());
    next_probe_ = absl::Now() + backoff_;
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    return std::nullopt;
  }
  last_answer_ = absl::Now();
  const bool restarted = epoch_.has_value() && *epoch_ != probe->epoch;
  epoch_ = probe->epoch;
  max_pass_tokens_ = probe->max_pass_tokens;
  prefix_cache_ = probe->prefix_cache;
  if (down_ || restarted) {
    Log(absl::StrCat(name_, " is back", restarted ? " (restarted: its sequences replay)" : ""));
  }
  down_ = false;
  backoff_ = options_.min_backoff;
  if (restarted) {
    orphans_.clear();  // the new process never saw them
  } else {
    ReleaseOrphans();
  }
  return restarted ? Recovery::kRestarted : Recovery::kSameProcess;
}

void SupervisedWorker::ReleaseOrphans() {
  std::vector<SeqId> released;
  for (const SeqId seq : orphans_) {
    // NOT_FOUND is as good as released: the worker never created the sequence or lost it.
    if (Release(seq).code() == absl::StatusCode::kUnavailable) break;
    released.push_back(seq);
  }
  for (const SeqId seq : released) orphans_.erase(seq);
}

absl::Status SupervisedWorker::UnavailableError() const {
  absl::string_view cause = last_error_.message();
  // The worker's client already names the worker; say it once.
  const std::string prefix = absl::StrCat(name_, ": ");
  if (absl::StartsWith(cause, prefix)) cause.remove_prefix(prefix.size());
  if (cause.empty()) cause = "it failed to answer";
  return absl::UnavailableError(absl::StrCat(name_, " is unavailable: ", cause));
}

}  // namespace specd
