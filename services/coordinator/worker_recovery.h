// Surviving worker crashes, restarts and hangs (issue 9). A worker's KV is only a cache of the
// coordinator's token lists (DESIGN.md), so a failed call costs a replay, never a request: the
// scheduler marks the worker down, probes it with backoff until it answers, and then either
// forgets everything it held (a new epoch: the process restarted) or resynchronises the
// sequences whose state there is in doubt (the same process, e.g. a hang that resumed).
#ifndef SPECD_SERVICES_COORDINATOR_WORKER_RECOVERY_H_
#define SPECD_SERVICES_COORDINATOR_WORKER_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/worker_api.h"

namespace specd {

struct RecoveryOptions {
  // How long a request may go without progress because a worker is unavailable before it fails
  // with UNAVAILABLE.
  absl::Duration unavailable_timeout = absl::Seconds(30);
  // A probe answers in milliseconds when the worker is up; a longer wait only delays the others.
  absl::Duration probe_timeout = absl::Seconds(1);
  absl::Duration min_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // A worker that has answered nothing for this long is probed, idle or not: a hung (stopped)
  // process keeps its connection open, so only a call finds it out, and health must say so
  // before a request waits for it. An Info probe costs the worker microseconds.
  absl::Duration quiet_probe_interval = absl::Seconds(2);
  // Told, in one line each, when a worker becomes unavailable and when it is back; may be empty.
  std::function<void(const std::string&)> on_event;
};

// True for the failures that a replay cures: the worker was unreachable or hung (UNAVAILABLE,
// DEADLINE_EXCEEDED), or it does not hold the sequence as the coordinator believes (NOT_FOUND
// after a restart, FAILED_PRECONDITION for a cached-length mismatch).
bool IsRecoverable(const absl::Status& status);

// A worker as the scheduler sees it: every call is forwarded, and a call that fails as a whole
// with UNAVAILABLE (the worker's client reports transport failures and missed deadlines that
// way) marks the worker down until a probe succeeds. Scheduler thread only.
class SupervisedWorker final : public WorkerApi {
 public:
  enum class Recovery { kSameProcess, kRestarted };

  // `inner` must outlive this object.
  SupervisedWorker(WorkerApi& inner, const RecoveryOptions& options);

  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override;
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override;
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override;
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) override;
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) override;
  absl::Status Release(SeqId seq) override;
  int64_t FreeKvTokens() const override { return inner_.FreeKvTokens(); }
  absl::StatusOr<WorkerProbe> Probe(absl::Duration timeout) override;
  std::string Name() const override { return name_; }

  bool up() const { return !down_; }
  // The per-pass token budget the worker declared at its last answered probe, if it says.
  std::optional<int64_t> max_pass_tokens() const { return max_pass_tokens_; }
  // Its prefix cache as of its last answered probe, if it says.
  std::optional<PrefixCacheShape> prefix_cache() const { return prefix_cache_; }
  // When the next probe is due; InfiniteFuture while the worker is up and trusted.
  absl::Time next_probe() const;

  // Learns the worker's epoch (or marks it down), so that a later restart is recognised.
  void ProbeNow(absl::Time now);
  // Asks for a probe before the next round: a sequence the worker should hold was not found, so
  // it may have restarted, and then all of its sequences are gone at once.
  void SuspectRestart() { probe_requested_ = true; }
  // Asks for a probe now if the transport dropped while the worker was thought up (it may have
  // died, or restarted, while nothing called it), or if it has been quiet for
  // quiet_probe_interval (it may hang).
  void CheckLiveness(absl::Time now);
  // Probes when one is due. nullopt while the worker is up and trusted or still unreachable;
  // otherwise it is up again, and orphans have been released (same process) or dropped.
  std::optional<Recovery> ProbeIfDue(absl::Time now);

  // A sequence whose request is gone but which the worker may still hold, because the Release
  // could not reach it. Released once the worker answers again; forgotten if it restarted.
  void AddOrphan(SeqId seq) { orphans_.insert(seq); }
  bool has_orphans() const { return !orphans_.empty(); }

  // "target worker at ADDR is unavailable: CAUSE".
  absl::Status UnavailableError() const;

 private:
  // Marks the worker down when `status` is a whole-call UNAVAILABLE, and notes any other answer
  // as a sign of life.
  void Observe(const absl::Status& status);
  void MarkDown(const absl::Status& status);
  void Log(const std::string& line) const;
  void ReleaseOrphans();

  WorkerApi& inner_;
  const RecoveryOptions options_;
  const std::string name_;
  bool down_ = false;
  bool probe_requested_ = false;
  absl::Status last_error_;
  absl::Time next_probe_ = absl::InfinitePast();
  absl::Time last_answer_ = absl::InfinitePast();
  absl::Duration backoff_;
  std::optional<uint64_t> epoch_;
  std::optional<int64_t> max_pass_tokens_;
  std::optional<PrefixCacheShape> prefix_cache_;
  absl::flat_hash_set<SeqId> orphans_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_WORKER_RECOVERY_H_
