#include "services/coordinator/scheduler.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specd {
namespace {

// Cache mismatches a request may meet without progress before its error is taken as final: a
// restart or a resumed hang costs one or two, a persistent one is a bug worth reporting.
constexpr int32_t kMaxMismatches = 8;

// How often an idle scheduler looks at its workers: their connections (a local check) and, for
// one that has been quiet a while, a probe (RecoveryOptions::quiet_probe_interval).
constexpr absl::Duration kIdleLivenessCheck = absl::Seconds(1);

RecoveryOptions RecoveryOptionsFrom(const SchedulerOptions& options) {
  RecoveryOptions r;
  r.unavailable_timeout = options.worker_unavailable_timeout;
  r.on_event = options.on_worker_event;
  return r;
}

}  // namespace

Scheduler::Scheduler(WorkerApi& draft, WorkerApi& target, const Tokenizer* tokenizer,
                     const SchedulerOptions& options)
    : tokenizer_(tokenizer), options_(options), admission_cap_(options.max_running) {
  // The coordinator validates the options at start-up (AdaptiveK::Create); defaults otherwise.
  if (absl::StatusOr<AdaptiveK> k = AdaptiveK::Create(options.adaptive_k); k.ok()) {
    adaptive_k_ = *std::move(k);
  }
  const RecoveryOptions recovery = RecoveryOptionsFrom(options);
  target_ = std::make_unique<SupervisedWorker>(target, recovery);
  if (&draft != &target) draft_ = std::make_unique<SupervisedWorker>(draft, recovery);
  if (options.prefix_sharing && options.prefix_block_size > 0) {
    computed_prefixes_.emplace(options.prefix_block_size, options.prefix_pool_blocks);
  }
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
  poked_ = true;
  cv_.notify_all();
  return handle;
}

void Scheduler::Cancel(RequestHandle handle) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(handle);
    poked_ = true;
  }
  cv_.notify_all();
}

void Scheduler::ReleaseOnWorkers(Active& a, bool gone) {
  // A sequence the worker never saw (or lost in a restart) is NOT_FOUND there: nothing to free.
  if (draft_ != nullptr && a.seq.uses_draft_worker() &&
      (a.seq.draft_cached > 0 || a.seq.num_speculative_tokens > 0 || a.draft_in_doubt)) {
    ReleaseOn(*draft_, a, gone);
  }
  ReleaseOn(*target_, a, gone);
  if (gone && computed_prefixes_.has_value()) computed_prefixes_->Touch(a.block_hashes);
  // Release frees a guided sequence's companion with it.
  a.seq.ResetDraftCache(0);
  a.seq.ResetTargetCache(0);
}

void Scheduler::ReleaseOn(SupervisedWorker& w, Active& a, bool gone) {
  bool& in_doubt = &w == target_.get() ? a.target_in_doubt : a.draft_in_doubt;
  if (w.up() && w.Release(a.seq.id).code() != absl::StatusCode::kUnavailable) {
    in_doubt = false;
    return;
  }
  // Unreachable: it may still hold the sequence. A live one is resynced before it runs there
  // again (a cached length of 0 then frees its blocks); a finished one is released later.
  if (gone) {
    w.AddOrphan(a.seq.id);
  } else {
    in_doubt = true;
  }
}

void Scheduler::Finish(Active& a, FinishReason reason, absl::Status error, GenerationEvent event) {
  if (a.text != nullptr) ReleaseOnWorkers(a, /*gone=*/true);
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

  GenerationEvent event;
  FinishReason reason = FinishReason::kNone;
  const GenerationRequest& r = a.request;
  for (size_t j = 0; j < stats.appended.size(); ++j) {
    const int32_t t = stats.appended[j];
    if (u.completion_tokens >= r.max_new_tokens) break;
    event.tokens.push_back(t);
    if (j < stats.logprobs.size()) event.logprobs.push_back(stats.logprobs[j]);
    ++u.completion_tokens;
    if (!r.ignore_eos && std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(),
                                   t) != options_.eos_token_ids.end()) {
      reason = FinishReason::kEosToken;
      break;
    }
    if (std::binary_search(r.stop_token_ids.begin(), r.stop_token_ids.end(), t)) {
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
    if (event.logprobs.size() > chunk->tokens_used) event.logprobs.resize(chunk->tokens_used);
    reason = FinishReason::kStopString;
  }
  // Only drafts that reach the client count as accepted: a stop inside the round drops the rest,
  // so the usage figures satisfy accepted + rounds <= completion + 1.
  const int32_t accepted = std::min(stats.accepted, static_cast<int32_t>(event.tokens.size()));
  u.accepted_tokens += accepted;
  if (static_cast<int64_t>(u.accepted_per_position.size()) < stats.drafted) {
    u.accepted_per_position.resize(static_cast<size_t>(stats.drafted), 0);
  }
  for (int32_t k = 0; k < accepted; ++k) ++u.accepted_per_position[static_cast<size_t>(k)];
  // A guided request's companion grows with it and is bounded by max_seq_len too.
  const int64_t len =
      std::max<int64_t>(
          static_cast<int64_t>(r.prompt.size()),
          r.guidance.has_value() ? static_cast<int64_t>(r.guidance->uncond_prompt.size()) : 0) +
      u.completion_tokens;
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

void Scheduler::StartSequence(Active& a) {
  a.text = std::make_unique<TextOutput>(tokenizer_, a.request.stop_strings, a.request.prompt);
  a.seq.id = a.handle;
  a.seq.tokens = a.request.prompt;
  a.seq.prompt_len = static_cast<int64_t>(a.request.prompt.size());
  a.seq.sampling = a.request.sampling;
  a.seq.logit_bias = a.request.logit_bias;
  a.seq.seed = a.request.seed;
  a.seq.num_speculative_tokens = a.request.num_speculative_tokens;
  a.seq.done_len = a.seq.prompt_len + a.request.max_new_tokens;
  a.seq.draft_sampling = a.request.draft_sampling;
  a.seq.draft_method = a.request.draft_method;
  a.seq.ngram = options_.ngram;
  a.seq.prediction = a.request.prediction;
  a.seq.tree = a.request.tree;
  a.seq.egag.enabled = a.request.egag;
  a.seq.egag.options = options_.egag;
  a.seq.num_candidates = options_.num_candidates;
  a.seq.sample = a.request.sample;
  a.seq.logprobs = a.request.logprobs;
  a.seq.prompt_logprobs = a.request.prompt_logprobs;
  a.seq.guidance = a.request.guidance;
  if (a.seq.guidance.has_value()) a.seq.guidance->companion = a.seq.id | kCompanionIdBit;
  a.usage.prompt_tokens = a.seq.prompt_len;
  a.usage.predicted = !a.request.prediction.empty();
}

bool Scheduler::Adapts(const Active& a) {
  // The cost model times chains of K model drafts; prompt lookup and trees keep their K.
  return a.request.adaptive_k && a.request.draft_method == DraftMethod::kModel &&
         !a.request.tree.is_tree();
}

int64_t Scheduler::KvTokensForNextRound(const Active& a, bool target) {
  const GenerationRequest& r = a.request;
  // Prompt lookup leaves nothing on the draft worker.
  if (!target && r.draft_method != DraftMethod::kModel) return 0;
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  const int64_t len = a.seq.tokens.empty() ? prompt : static_cast<int64_t>(a.seq.tokens.size());
  const int64_t round = (r.tree.is_tree() ? TreeNodeCount(r.tree, r.num_speculative_tokens)
                                          : r.num_speculative_tokens) +
                        1;
  int64_t need = len + round;
  if (r.guidance.has_value() && (target || r.guidance->draft)) {
    need += static_cast<int64_t>(r.guidance->uncond_prompt.size()) + (len - prompt) + round;
  }
  return need;
}

KChoice Scheduler::PlanK() {
  const bool draft_up = draft_ != nullptr && draft_->up();
  int32_t requested = 0;
  for (const auto& a : running_) {
    if (Adapts(*a)) requested = std::max(requested, a->request.num_speculative_tokens);
  }
  const KChoice choice =
      adaptive_k_.Choose(static_cast<int32_t>(running_.size()), draft_up ? requested : 0);
  for (auto& a : running_) {
    const int32_t asked = a->request.num_speculative_tokens;
    // Prompt lookup needs no draft worker. Model drafting without one decodes plainly when the
    // request lets the server choose K; a FIXED request keeps its K (and waits for the worker).
    a->seq.num_speculative_tokens = !a->seq.uses_draft_worker() || !a->request.adaptive_k ? asked
                                    : !draft_up                                           ? 0
                                    : Adapts(*a) ? std::min(asked, choice.k)
                                                 : asked;
  }
  return choice;
}

void Scheduler::ObserveRound(const std::vector<RoundStats>& stats, const RoundPhaseTimes& times,
                             const std::vector<std::optional<int64_t>>& draft_catch_up) {
  RoundObservation obs;
  for (size_t i = 0; i < stats.size(); ++i) {
    // One the pass budget left out took no part in the round's passes. One that only prefilled,
    // or only read its prompt before its first token, drafted nothing, but its chunk went
    // through the draft's first pass.
    if (stats[i].deferred) continue;
    ++obs.batch_size;
    if (!draft_catch_up[i].has_value()) continue;
    obs.draft_catch_up_tokens += *draft_catch_up[i];
    if (!stats[i].prefilling && stats[i].drafted > 0) ++obs.drafting_sequences;
  }
  obs.draft_steps = times.draft_steps;
  obs.draft_forward = times.draft_forward;
  obs.verify_tokens = times.verify_tokens;
  obs.verify_forward = times.verify_forward;
  obs.round = times.round;
  for (size_t i = 0; i < stats.size(); ++i) {
    const RoundStats& st = stats[i];
    if (!st.status.ok()) return;
    // Acceptance is the model draft's: prompt lookup and trees follow other statistics.
    if (!Adapts(*running_[i])) continue;
    obs.drafted_tokens += st.drafted;
    obs.accepted_tokens += st.accepted;
    if (st.accepted < st.drafted) ++obs.rejections;
  }
  // Counts that contradict each other would be a bug here, not bad input: skip the round.
  (void)adaptive_k_.Observe(obs);
}

std::vector<SupervisedWorker*> Scheduler::workers() {
  std::vector<SupervisedWorker*> out = {target_.get()};
  if (draft_ != nullptr) out.push_back(draft_.get());
  return out;
}

void Scheduler::RecoverWorkers() {
  for (SupervisedWorker* w : workers()) {
    if (!shutting_down_.load()) w->CheckLiveness(absl::Now());
    if (w->ProbeIfDue(absl::Now()) != SupervisedWorker::Recovery::kRestarted) continue;
    if (options_.on_worker_restart) options_.on_worker_restart(w == target_.get());
    if (w == target_.get()) FollowTargetPrefixCache();
    // An operator may restart a worker with another --max-pass-tokens (as the deferred metric
    // advises); the budget is the new process's from its first round.
    int64_t& budget = w == target_.get() ? options_.target_pass_tokens : options_.draft_pass_tokens;
    if (const std::optional<int64_t> declared = w->max_pass_tokens();
        declared.has_value() && *declared != budget) {
      if (options_.on_worker_event) {
        options_.on_worker_event(absl::StrCat(w->Name(), " takes passes of up to ", *declared,
                                              " tokens now (was ", budget, ")"));
      }
      budget = *declared;
    }
    // A new process holds nothing: every sequence replays from position 0 there.
    auto forget = [&](Active& a) {
      if (w == target_.get()) {
        a.seq.ResetTargetCache(0);
        a.target_in_doubt = false;
        a.block_hashes.clear();  // recorded again as it replays into the new cache
      } else {
        a.seq.ResetDraftCache(0);
        a.draft_in_doubt = false;
      }
    };
    for (auto& a : running_) forget(*a);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& a : waiting_) forget(*a);
  }
}

void Scheduler::FollowTargetPrefixCache() {
  const std::optional<PrefixCacheShape> shape = target_->prefix_cache();
  if (!options_.prefix_sharing || !shape.has_value()) {
    if (computed_prefixes_.has_value()) computed_prefixes_->Clear();
    return;
  }
  const int64_t was = computed_prefixes_.has_value() ? computed_prefixes_->block_size() : 0;
  if (shape->block_size > 0) {
    computed_prefixes_.emplace(shape->block_size, shape->pool_blocks);
  } else {
    computed_prefixes_.reset();
  }
  if (shape->block_size == was || !options_.on_worker_event) return;
  options_.on_worker_event(
      shape->block_size > 0
          ? absl::StrCat(target_->Name(), " caches prefixes in blocks of ", shape->block_size,
                         " tokens now: prompts that share them compute them once")
          : absl::StrCat(target_->Name(),
                         " caches no prefixes now: each prompt computes its own copy until it "
                         "does (--prefix-caching)"));
}

bool Scheduler::Resync(Active& a, SupervisedWorker& w) {
  const bool target = &w == target_.get();
  int64_t& cached = target ? a.seq.target_cached : a.seq.draft_cached;
  // Whatever the worker holds up to here is a prefix of x: it was fed from x, and drafts past the
  // old x were never committed. The last token stays out, as every catch-up re-feeds it. A tree
  // whose accepted branch was never moved into place is dropped whole (a guided sequence has no
  // trees).
  const int64_t len = static_cast<int64_t>(a.seq.tokens.size());
  const KvCompaction& compact = target ? a.seq.target_compact : a.seq.draft_compact;
  int64_t keep = std::clamp<int64_t>(cached, 0, len - 1);
  if (!compact.empty()) keep = std::min(keep, compact.tree_start);
  (target ? a.seq.target_compact : a.seq.draft_compact) = KvCompaction();
  TruncateSequenceRequest request;
  request.seq = a.seq.id;
  request.new_len = keep;
  // A guided pair is resynced as one: the companion's copy is a prefix of u, as x's is of x.
  std::optional<Guidance>& g = a.seq.guidance;
  int64_t* companion_cached = nullptr;
  if (g.has_value() && (target || g->draft)) {
    companion_cached = target ? &g->target_cached : &g->draft_cached;
    request.companion_new_len =
        std::clamp<int64_t>(*companion_cached, 0, a.seq.CompanionLen(len) - 1);
  }
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> answers =
      w.Truncate(std::span(&request, 1));
  const absl::StatusOr<TruncateResult> t =
      answers.ok() ? std::move(answers->front().value) : answers.status();
  if (t.ok()) {
    cached = t->cached_len;
    if (companion_cached != nullptr) *companion_cached = t->companion_cached_len;
  } else if (t.status().code() == absl::StatusCode::kNotFound) {
    cached = 0;
    if (companion_cached != nullptr) *companion_cached = 0;
  } else {
    if (!w.up()) return false;
    // Anything else: start over there.
    if (w.Release(a.seq.id).code() == absl::StatusCode::kUnavailable) return false;
    cached = 0;
    if (companion_cached != nullptr) *companion_cached = 0;
  }
  (target ? a.target_in_doubt : a.draft_in_doubt) = false;
  return true;
}

SupervisedWorker* Scheduler::UnavailableWorkerFor(const Active& a) const {
  if (!target_->up()) return target_.get();
  const int32_t k = a.text != nullptr ? EffectiveK(a.seq, options_.max_seq_len)
                                      : a.request.num_speculative_tokens;
  if (draft_ != nullptr && a.request.draft_method == DraftMethod::kModel && k > 0 &&
      !draft_->up()) {
    return draft_.get();
  }
  return nullptr;
}

SupervisedWorker* Scheduler::BlockingWorker(Active& a) {
  // A draft copy in doubt is resynced even when this round does not draft, so that a later
  // round with K > 0 finds it known. Resync fails only when the worker went down meanwhile.
  if (draft_ != nullptr && a.draft_in_doubt && draft_->up()) (void)Resync(a, *draft_);
  if (a.target_in_doubt && target_->up()) (void)Resync(a, *target_);
  return UnavailableWorkerFor(a);
}

bool Scheduler::StallExpired(Active& a, absl::Time now) {
  if (!a.stalled_since.has_value()) a.stalled_since = now;
  return now - *a.stalled_since >= options_.worker_unavailable_timeout;
}

bool Scheduler::SurvivesFailedRound(Active& a, absl::Status* error) {
  if (!IsRecoverable(*error)) return false;
  // Nothing of the round was committed, and either worker may hold part of it.
  a.target_in_doubt = true;
  a.draft_in_doubt = draft_ != nullptr;
  const absl::StatusCode code = error->code();
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    SupervisedWorker& w = draft_ != nullptr && !draft_->up() && target_->up() ? *draft_ : *target_;
    if (!StallExpired(a, absl::Now())) return true;
    *error = w.UnavailableError();
    return false;
  }
  // The worker does not hold the sequence as believed: it may have restarted between rounds,
  // and then all of its sequences are gone at once.
  for (SupervisedWorker* w : workers()) w->SuspectRestart();
  return ++a.mismatches <= kMaxMismatches;
}

std::optional<absl::Time> Scheduler::NextWake() const {
  absl::Time wake = absl::InfiniteFuture();
  const bool busy = !running_.empty() || waiting_count_.load() > 0;
  // A worker that is down is probed even while nothing runs: health waits for it, and a load
  // balancer that trusts health sends no request to wake the scheduler.
  for (const SupervisedWorker* w : {target_.get(), draft_.get()}) {
    if (w != nullptr && (busy || w->has_orphans() || !w->up())) {
      wake = std::min(wake, w->next_probe());
    }
  }
  for (const auto& a : running_) {
    if (a->stalled_since.has_value()) {
      wake = std::min(wake, *a->stalled_since + options_.worker_unavailable_timeout);
    }
  }
  if (wake == absl::InfiniteFuture()) return std::nullopt;
  return wake;
}

absl::Status Scheduler::TargetStatus() const {
  std::lock_guard<std::mutex> lock(target_status_mu_);
  return target_status_;
}

void Scheduler::PublishWorkerState() {
  for (SupervisedWorker* w : workers()) {
    const bool target = w == target_.get();
    bool& told = worker_up_[target ? 1 : 0];
    if (w->up() != told) {
      told = w->up();
      if (options_.on_worker_up) options_.on_worker_up(target, told);
    }
  }
  absl::Status now = target_->up() ? absl::OkStatus() : target_->UnavailableError();
  std::lock_guard<std::mutex> lock(target_status_mu_);
  target_status_ = std::move(now);
}

void Scheduler::Loop() {
  for (SupervisedWorker* w : workers()) w->ProbeNow(absl::Now());  // learns each epoch
  while (true) {
    std::vector<std::unique_ptr<Active>> dropped;
    // Queued too long for an unavailable worker, and which one.
    std::vector<std::pair<std::unique_ptr<Active>, SupervisedWorker*>> expired;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (idle_until_.has_value()) {
        // Everything waits for an unavailable worker: sleep until its next probe or the first
        // stall deadline, unless a request arrives or is cancelled.
        cv_.wait_until(lock, absl::ToChronoTime(*idle_until_), [&] { return stopping_ || poked_; });
        idle_until_.reset();
      } else {
        // Idle, it still looks at the workers now and then (RecoverWorkers), so that one that
        // died or hung meanwhile turns health NOT_SERVING before a request finds out.
        cv_.wait_for(lock, absl::ToChronoNanoseconds(kIdleLivenessCheck),
                     [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      }
      poked_ = false;
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
      // Queued requests wait for an unavailable worker as running ones do, and as long.
      const absl::Time now = absl::Now();
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        SupervisedWorker* w = UnavailableWorkerFor(**it);
        if (w != nullptr && StallExpired(**it, now)) {
          expired.emplace_back(std::move(*it), w);
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      // Admission against the workers' free KV as of their latest replies: a request joins only
      // if its tokens so far plus one full round fit in both pools, a guided request's companion
      // included (on the draft only when the draft is guided too). With nothing running the head
      // is admitted anyway, so one that can never fit gets its error instead of waiting forever.
      int64_t target_budget = target_->FreeKvTokens();
      int64_t draft_budget = draft_ != nullptr ? draft_->FreeKvTokens() : 0;
      while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < admission_cap_) {
        const Active& next = *waiting_.front();
        const int64_t target_need = KvTokensForNextRound(next, /*target=*/true);
        const int64_t draft_need =
            draft_ != nullptr ? KvTokensForNextRound(next, /*target=*/false) : 0;
        if ((target_need > target_budget || draft_need > draft_budget) && !running_.empty()) {
          break;
        }
        target_budget -= target_need;
        draft_budget -= draft_need;
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      cancelled_.clear();  // handles of requests already gone
      waiting_count_ = static_cast<int64_t>(waiting_.size());
      running_count_ = static_cast<int64_t>(running_.size());
    }
    for (auto& a : dropped) {
      if (a->text != nullptr) ReleaseOnWorkers(*a, /*gone=*/true);
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
    RecoverWorkers();
    PublishWorkerState();
    for (auto& [a, w] : expired) {
      Finish(*a, FinishReason::kNone, w->UnavailableError(), GenerationEvent());
    }

    // The batch: every running request whose workers are available. The others keep their
    // place until their worker is back or their stall runs out.
    std::vector<std::unique_ptr<Active>> still;
    std::vector<std::unique_ptr<Active>> ready;
    const absl::Time now = absl::Now();
    for (auto& a : running_) {
      if (a->text == nullptr) StartSequence(*a);  // newly admitted
    }
    const KChoice k_choice = PlanK();
    for (auto& a : running_) {
      if (SupervisedWorker* w = BlockingWorker(*a); w != nullptr) {
        if (StallExpired(*a, now)) {
          Finish(*a, FinishReason::kNone, w->UnavailableError(), GenerationEvent());
        } else {
          still.push_back(std::move(a));
        }
        continue;
      }
      ready.push_back(std::move(a));
    }
    running_ = std::move(ready);
    // Prompts that share blocks another sequence is computing wait for its prefix-cache entries
    // (prefix_sharing.h), keeping their place.
    {
      std::vector<const SpeculativeSequence*> seqs;
      for (const auto& a : running_) seqs.push_back(&a->seq);
      const std::vector<bool> waits = WaitsForSharedPrefix(
          seqs, computed_prefixes_.has_value() ? &*computed_prefixes_ : nullptr);
      std::vector<std::unique_ptr<Active>> sharing;
      for (size_t i = 0; i < running_.size(); ++i) {
        (waits[i] ? still : sharing).push_back(std::move(running_[i]));
      }
      const auto waiting = static_cast<int64_t>(running_.size() - sharing.size());
      if (waiting > 0 && options_.on_prefix_wait) options_.on_prefix_wait(waiting);
      running_ = std::move(sharing);
    }
    if (running_.empty()) {
      running_ = std::move(still);
      running_count_ = static_cast<int64_t>(running_.size());
      idle_until_ = NextWake();
      continue;
    }

    std::vector<SpeculativeSequence*> batch;
    std::vector<std::optional<int64_t>> draft_catch_up;
    for (auto& a : running_) {
      batch.push_back(&a->seq);
      draft_catch_up.push_back(
          a->seq.uses_draft_worker() && !a->seq.scoring() &&
                  EffectiveK(a->seq, options_.max_seq_len) > 0
              ? std::optional<int64_t>(static_cast<int64_t>(a->seq.tokens.size()) -
                                       a->seq.draft_cached)
              : std::nullopt);
    }
    RoundPhaseTimes phase_times;
    const std::vector<RoundStats> stats =
        RunSpeculationRound(draft(), *target_, batch,
                            RoundOptions{options_.max_seq_len, &phase_times, options_.prefill_chunk,
                                         options_.draft_pass_tokens, options_.target_pass_tokens});
    if (options_.on_round) options_.on_round(phase_times);
    if (computed_prefixes_.has_value()) {
      for (size_t i = 0; i < running_.size(); ++i) {
        if (!stats[i].status.ok()) continue;
        Active& a = *running_[i];
        computed_prefixes_->Record(a.seq.tokens, a.seq.target_cached, a.block_hashes);
      }
    }
    ObserveRound(stats, phase_times, draft_catch_up);
    if (options_.on_k_choice) options_.on_k_choice(k_choice, adaptive_k_.alpha());
    if (options_.on_deferred) {
      const int64_t deferred = std::count_if(stats.begin(), stats.end(),
                                             [](const RoundStats& st) { return st.deferred; });
      if (deferred > 0) options_.on_deferred(deferred);
    }
    if (options_.on_draft_length) {
      for (const RoundStats& st : stats) {
        if (st.status.ok() && st.drafted > 0)
          options_.on_draft_length(st.drafted, st.entropy_stopped);
      }
    }
    std::deque<std::unique_ptr<Active>> preempted;
    absl::Status exhausted;  // why the first of them was preempted
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = *running_[i];
      if (stats[i].prompt_logprobs.has_value()) {
        GenerationEvent scores;
        scores.prompt_logprobs = stats[i].prompt_logprobs;
        a.sink(std::move(scores));
      }
      if (stats[i].status.code() == absl::StatusCode::kResourceExhausted) {
        // KV is full: give this sequence's blocks back and replay it later. Its committed tokens
        // and seed make the replay exact (DESIGN.md, "Randomness").
        ReleaseOnWorkers(a, /*gone=*/false);
        ++preemptions_;
        if (exhausted.ok()) exhausted = stats[i].status;
        preempted.push_back(std::move(running_[i]));
        continue;
      }
      if (!stats[i].status.ok()) {
        absl::Status error = stats[i].status;
        if (SurvivesFailedRound(a, &error)) {
          still.push_back(std::move(running_[i]));
        } else {
          Finish(a, FinishReason::kNone, std::move(error), GenerationEvent());
        }
        continue;
      }
      a.stalled_since.reset();
      a.mismatches = 0;
      // A prefill chunk is progress but commits nothing: the request has no token to stream yet.
      // A sequence the pass budget deferred waits for the next round.
      if (stats[i].prefilling || stats[i].deferred || !Commit(a, stats[i], phase_times)) {
        still.push_back(std::move(running_[i]));
      }
    }
    running_ = std::move(still);
    // A pass that ran out of device memory (a scratch allocation, not KV blocks) preempts its
    // whole batch, and admission by free KV would put the same batch back into the same failing
    // pass forever: after such a round fewer run at once, and the cap grows back a step per
    // round that preempts nothing.
    if (batch.size() > 1 && preempted.size() == batch.size()) {
      admission_cap_ = std::max<int64_t>(1, static_cast<int64_t>(batch.size()) / 2);
    } else if (preempted.empty() && admission_cap_ < options_.max_running) {
      ++admission_cap_;
    }
    if (!preempted.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (batch.size() == 1 && running_.empty()) {
        // Alone in both pools and still out of memory: it can never fit. One preempted beside
        // others that finished in this round may fit once their blocks are free (it is requeued,
        // and runs alone next); queued requests hold no KV, so they change nothing either way.
        Active& a = *preempted.front();
        Finish(a, FinishReason::kNone,
               absl::ResourceExhaustedError(
                   absl::StrCat("the request does not fit in the workers' memory even alone (",
                                exhausted.message(), ")")),
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
