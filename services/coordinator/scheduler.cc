#include "services/coordinator/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specd {

Scheduler::Scheduler(WorkerApi& draft, WorkerApi& target, const Tokenizer* tokenizer,
                     const SchedulerOptions& options)
    : draft_(draft), target_(target), tokenizer_(tokenizer), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::StatusOr<Scheduler::RequestHandle> Scheduler::Submit(GenerationRequest request,
                                                           EventSink sink) {
  auto a = std::make_unique<Active>();
  a->request = std::move(request);
  a->sink = std::move(sink);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  if (static_cast<int64_t>(waiting_.size()) >= options_.max_queued) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request queue is full (", options_.max_queued, " waiting); retry later"));
  }
  a->handle = next_handle_++;
  const RequestHandle handle = a->handle;
  waiting_.push_back(std::move(a));
  waiting_count_ = static_cast<int64_t>(waiting_.size());
  cv_.notify_all();
  return handle;
}

void Scheduler::Cancel(RequestHandle handle) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(handle);
  }
  cv_.notify_all();
}

void Scheduler::ReleaseOnWorkers(Active& a) {
  // A sequence the worker never saw (or lost in a restart) is NOT_FOUND there: nothing to free.
  if (a.seq.draft_cached > 0 || a.seq.num_speculative_tokens > 0) (void)draft_.Release(a.seq.id);
  (void)target_.Release(a.seq.id);
  a.seq.draft_cached = 0;
  a.seq.target_cached = 0;
}

void Scheduler::Finish(Active& a, FinishReason reason, absl::Status error, GenerationEvent event) {
  ReleaseOnWorkers(a);
  event.finish = reason;
  event.error = std::move(error);
  event.usage = a.usage;
  a.sink(std::move(event));
}

bool Scheduler::Commit(Active& a, const RoundStats& stats, const RoundPhaseTimes& times) {
  GenerationUsage& u = a.usage;
  if (u.rounds > 0) {
    ++u.timed_rounds;
    u.timed_draft_steps += stats.drafted;
    u.draft_forward += times.draft_forward;
    u.verify_forward += times.verify_forward;
    u.round_time += times.round;
  }
  ++u.rounds;
  if (stats.drafted > 0) ++u.drafting_rounds;
  u.draft_tokens += stats.drafted;
  u.accepted_tokens += stats.accepted;
  if (static_cast<int64_t>(u.accepted_per_position.size()) < stats.drafted) {
    u.accepted_per_position.resize(static_cast<size_t>(stats.drafted), 0);
  }
  for (int32_t k = 0; k < stats.accepted; ++k) ++u.accepted_per_position[static_cast<size_t>(k)];

  GenerationEvent event;
  FinishReason reason = FinishReason::kNone;
  const GenerationRequest& r = a.request;
  for (const int32_t t : stats.appended) {
    if (u.completion_tokens >= r.max_new_tokens) break;
    event.tokens.push_back(t);
    ++u.completion_tokens;
    if (!r.ignore_eos && std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(),
                                   t) != options_.eos_token_ids.end()) {
      reason = FinishReason::kEosToken;
      break;
    }
    if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), t) != r.stop_token_ids.end()) {
      reason = FinishReason::kStopToken;
      break;
    }
  }
  // Tokens past a stop are dropped from x too, so usage and the stream agree.
  absl::StatusOr<TextOutput::Chunk> chunk = a.text->Push(event.tokens);
  if (!chunk.ok()) {
    Finish(a, FinishReason::kNone, chunk.status(), GenerationEvent());
    return true;
  }
  event.text = std::move(chunk->text);
  if (chunk->stopped) {
    u.completion_tokens -= static_cast<int64_t>(event.tokens.size() - chunk->tokens_used);
    event.tokens.resize(chunk->tokens_used);
    reason = FinishReason::kStopString;
  }
  const int64_t len = static_cast<int64_t>(r.prompt.size()) + u.completion_tokens;
  if (reason == FinishReason::kNone &&
      (u.completion_tokens >= r.max_new_tokens || len >= options_.max_seq_len)) {
    reason = FinishReason::kLength;
  }
  if (reason == FinishReason::kNone) {
    if (!event.tokens.empty()) a.sink(std::move(event));
    return false;
  }
  if (reason != FinishReason::kStopString) {
    absl::StatusOr<std::string> tail = a.text->Finish();
    if (tail.ok()) event.text += *tail;
    if (a.text->stopped()) reason = FinishReason::kStopString;
  }
  Finish(a, reason, absl::OkStatus(), std::move(event));
  return true;
}

void Scheduler::Loop() {
  while (true) {
    std::vector<std::unique_ptr<Active>> dropped;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) {
        for (auto& a : waiting_) running_.push_back(std::move(a));
        waiting_.clear();
        for (auto& a : running_) dropped.push_back(std::move(a));
        running_.clear();
      }
      // Cancellations take effect between rounds, in the queue and in the batch alike.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (cancelled_.erase((*it)->handle) > 0) {
          dropped.push_back(std::move(*it));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& a : running_) {
        if (a != nullptr && cancelled_.erase(a->handle) > 0) dropped.push_back(std::move(a));
      }
      running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
      // Admission against the workers' free KV as of their latest replies: a request joins only
      // if its tokens so far plus one full round fit in both pools. With nothing running the head
      // is admitted anyway, so one that can never fit gets its error instead of waiting forever.
      int64_t budget = std::min(draft_.FreeKvTokens(), target_.FreeKvTokens());
      while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
        const Active& next = *waiting_.front();
        const int64_t need =
            static_cast<int64_t>(next.seq.tokens.empty() ? next.request.prompt.size()
                                                         : next.seq.tokens.size()) +
            next.request.num_speculative_tokens + 1;
        if (need > budget && !running_.empty()) break;
        budget -= need;
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      cancelled_.clear();  // handles of requests already gone
      waiting_count_ = static_cast<int64_t>(waiting_.size());
      running_count_ = static_cast<int64_t>(running_.size());
    }
    for (auto& a : dropped) {
      if (a->text != nullptr) ReleaseOnWorkers(*a);
      GenerationEvent event;
      event.error = absl::CancelledError("the request was cancelled");
      event.usage = a->usage;
      a->sink(std::move(event));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && waiting_.empty()) {
        running_count_ = 0;
        return;
      }
    }
    if (running_.empty()) continue;

    std::vector<SpeculativeSequence*> batch;
    for (auto& a : running_) {
      if (a->text == nullptr) {  // newly admitted
        a->text =
            std::make_unique<TextOutput>(tokenizer_, a->request.stop_strings, a->request.prompt);
        a->seq.id = a->handle;
        a->seq.tokens = a->request.prompt;
        a->seq.prompt_len = static_cast<int64_t>(a->request.prompt.size());
        a->seq.sampling = a->request.sampling;
        a->seq.seed = a->request.seed;
        a->seq.num_speculative_tokens = a->request.num_speculative_tokens;
        a->seq.draft_mode = a->request.draft_mode;
        a->seq.num_candidates = options_.num_candidates;
        a->usage.prompt_tokens = a->seq.prompt_len;
      }
      batch.push_back(&a->seq);
    }
    RoundPhaseTimes phase_times;
    const std::vector<RoundStats> stats = RunSpeculationRound(
        draft_, target_, batch, RoundOptions{options_.max_seq_len, &phase_times});
    if (options_.on_round) options_.on_round(phase_times);
    std::vector<std::unique_ptr<Active>> still;
    std::deque<std::unique_ptr<Active>> preempted;
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = *running_[i];
      if (stats[i].status.code() == absl::StatusCode::kResourceExhausted) {
        // KV is full: give this sequence's blocks back and replay it later. Its committed tokens
        // and seed make the replay exact (DESIGN.md, "Randomness").
        ReleaseOnWorkers(a);
        ++preemptions_;
        preempted.push_back(std::move(running_[i]));
        continue;
      }
      if (!stats[i].status.ok()) {
        Finish(a, FinishReason::kNone, stats[i].status, GenerationEvent());
        continue;
      }
      if (!Commit(a, stats[i], phase_times)) still.push_back(std::move(running_[i]));
    }
    running_ = std::move(still);
    if (!preempted.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_.empty() && waiting_.empty() && preempted.size() == 1) {
        // Alone and still out of KV: it can never fit.
        Active& a = *preempted.front();
        Finish(a, FinishReason::kNone,
               absl::ResourceExhaustedError("the request does not fit in the workers' KV cache"),
               GenerationEvent());
        preempted.clear();
      }
      for (auto it = preempted.rbegin(); it != preempted.rend(); ++it) {
        waiting_.push_front(std::move(*it));
      }
      waiting_count_ = static_cast<int64_t>(waiting_.size());
    }
    running_count_ = static_cast<int64_t>(running_.size());
  }
}

}  // namespace specd
