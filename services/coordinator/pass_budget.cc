#include "services/coordinator/pass_budget.h"

#include <algorithm>
#include <array>
#include <limits>
#include <numeric>

namespace specd {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

int64_t Halves(const WorkerFeed& f) { return f.companion ? 2 : 1; }

// The longer catch-up of the sequence and its companion: a pair completes only together.
int64_t Longest(const WorkerFeed& f) {
  return f.companion ? std::max(f.catch_up, f.companion_catch_up) : f.catch_up;
}

// The most tokens a round with this chunk feeds the worker: the catch-up within the chunk and,
// should the round complete there (the rest may be in the prefix cache), the drafts.
int64_t RunCost(const WorkerFeed& f, int64_t chunk) {
  if (!f.called) return 0;
  return std::min(f.catch_up, chunk) + (f.companion ? std::min(f.companion_catch_up, chunk) : 0) +
         f.drafts * Halves(f);
}

// The largest prefill chunk this worker may feed each half: never the last catch-up token.
int64_t PrefillCap(const WorkerFeed& f, int64_t chunk, int64_t left) {
  return std::min({chunk, left / Halves(f), Longest(f) - 1});
}

}  // namespace

bool Decoding(const SequenceFeeds& feeds) {
  for (const WorkerFeed* f : {&feeds.draft, &feeds.target}) {
    if (f->called && Longest(*f) > 1) return false;
  }
  return feeds.draft.called || feeds.target.called;
}

int32_t RoundsLeftOut(const SequenceFeeds& feeds, const FeedPlan& plan) {
  const bool left_out = plan.action == FeedPlan::Action::kWait && Decoding(feeds);
  return left_out ? feeds.rounds_left_out + 1 : 0;
}

std::vector<FeedPlan> PlanFeeds(std::span<const SequenceFeeds> batch, int64_t prefill_chunk,
                                int64_t draft_budget, int64_t target_budget) {
  const int64_t chunk = prefill_chunk > 0 ? prefill_chunk : kUnlimited;
  std::array<int64_t, 2> left = {draft_budget > 0 ? draft_budget : kUnlimited,
                                 target_budget > 0 ? target_budget : kUnlimited};
  auto take = [&left](size_t w, int64_t tokens) {
    if (left[w] != kUnlimited) left[w] -= std::min(tokens, left[w]);
  };
  auto feeds_of = [&batch](size_t i) {
    return std::array<const WorkerFeed*, 2>{&batch[i].draft, &batch[i].target};
  };
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&batch](size_t a, size_t b) {
    return batch[a].rounds_left_out > batch[b].rounds_left_out;
  });
  std::vector<FeedPlan> plans(batch.size());
  std::vector<bool> planned(batch.size(), false);
  bool served = false;  // some sequence calls a worker this round
  // Rounds as they would be without a budget first, so that running streams keep decoding while
  // prompts wait their turn.
  for (const size_t i : order) {
    const auto feeds = feeds_of(i);
    const std::array<int64_t, 2> cost = {RunCost(*feeds[0], chunk), RunCost(*feeds[1], chunk)};
    if (cost[0] > left[0] || cost[1] > left[1]) continue;
    plans[i].draft_prefill_limit = plans[i].target_prefill_limit = prefill_chunk;
    for (size_t w = 0; w < 2; ++w) take(w, cost[w]);
    planned[i] = true;
    served = served || feeds[0]->called || feeds[1]->called;
  }
  // Then prefill chunks from what is left.
  for (const size_t i : order) {
    if (planned[i]) continue;
    const auto feeds = feeds_of(i);
    bool feeds_some = false;
    bool blocked = false;  // a worker has catch-up to prefill but no room for a token of it
    std::array<int64_t, 2> cap = {0, 0};
    for (size_t w = 0; w < 2; ++w) {
      if (!feeds[w]->called || Longest(*feeds[w]) <= 1) continue;
      cap[w] = PrefillCap(*feeds[w], chunk, left[w]);
      (cap[w] >= 1 ? feeds_some : blocked) = true;
    }
    FeedPlan& plan = plans[i];
    if (feeds_some && !blocked) {
      plan.action = FeedPlan::Action::kPrefillOnly;
      plan.draft_prefill_limit = std::max<int64_t>(cap[0], 1);
      plan.target_prefill_limit = std::max<int64_t>(cap[1], 1);
      for (size_t w = 0; w < 2; ++w) take(w, cap[w] * Halves(*feeds[w]));
      served = true;
    } else {
      plan.action = FeedPlan::Action::kWait;
    }
  }
  if (!served) {
    // Nothing fits: the first sequence in turn runs whatever it costs, so the round makes progress.
    // Only drafts can exceed a budget on their own, and a worker declares at least
    // kMinMaxPassTokens, more than any one sequence's round drafts.
    for (const size_t i : order) {
      const auto feeds = feeds_of(i);
      if (!feeds[0]->called && !feeds[1]->called) continue;
      plans[i] = FeedPlan{FeedPlan::Action::kRun, prefill_chunk, prefill_chunk};
      break;
    }
  }
  return plans;
}

}  // namespace specd
