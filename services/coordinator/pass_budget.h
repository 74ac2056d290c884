// The per-pass token budget: what each sequence of a round may feed each worker, so that no Draft
// or Verify forward pass takes more tokens than the worker reserved scratch memory for
// (InfoResponse.max_pass_tokens, vLLM's max_num_batched_tokens). Without it, the prefill chunks
// of many new requests meet in one pass whose activations outgrow the worker's share of the GPU.
//
// Rounds as they would be without a budget come first, so running streams keep decoding while
// long prompts take turns (as in vLLM's chunked prefill). Each pass goes through the batch in
// order of rounds left out, longest first, then first come first served. Only decoding streams
// count rounds left out: when even their rounds outgrow the budget they take turns, rather than
// the last of them waiting for the first to finish, while prompts prefill one after another
// (turns would delay every prompt's first token to near the last one's).
//   1. a sequence whose round (its catch-up within the chunk, then its drafts or tree nodes, twice
//      with a CFG companion) fits what is left on every worker it calls runs as usual;
//   2. one that does not, but has catch-up left to prefill, feeds each worker a chunk cut to what
//      is left there and draws nothing (prefill_only); one that can feed nothing waits for the
//      next round.
// When nothing fits, the first sequence in that order runs anyway, so every round makes progress. A
// worker's catch-up of one token is the last committed one, which only a whole round feeds.
#ifndef SPECD_SERVICES_COORDINATOR_PASS_BUDGET_H_
#define SPECD_SERVICES_COORDINATOR_PASS_BUDGET_H_

#include <cstdint>
#include <span>
#include <vector>

namespace specd {

// One sequence's round on one worker, as it would be without a budget.
struct WorkerFeed {
  bool called = false;             // the sequence calls this worker this round
  int64_t catch_up = 0;            // x[len_w:]
  bool companion = false;          // a CFG companion is fed beside it on this worker
  int64_t companion_catch_up = 0;  // u[len_c:]
  int64_t drafts = 0;              // tokens a complete round feeds after the catch-up
};

struct SequenceFeeds {
  WorkerFeed draft;
  WorkerFeed target;
  // Consecutive rounds the budget made this decoding stream wait (RoundsLeftOut).
  int32_t rounds_left_out = 0;
};

struct FeedPlan {
  enum class Action {
    kRun,          // the whole round, as without a budget
    kPrefillOnly,  // catch-up chunks only, on both workers; nothing is drafted or verified
    kWait,         // not sent to either worker this round
  };
  Action action = Action::kRun;
  // Each worker's max_prefill_tokens (0 = no limit).
  int64_t draft_prefill_limit = 0;
  int64_t target_prefill_limit = 0;
};

// A stream whose round feeds each worker it calls only its last committed token before the
// drafts (a companion's too): not a prompt, nor a sequence replaying on a restarted worker.
bool Decoding(const SequenceFeeds& feeds);

// The count the next round's plan sorts by: one more than `feeds.rounds_left_out` for a decoding
// stream that `plan` leaves out, else 0.
int32_t RoundsLeftOut(const SequenceFeeds& feeds, const FeedPlan& plan);

// `prefill_chunk`: catch-up tokens per sequence and round without a budget (0 = all). A budget of
// 0 is no limit on that worker.
std::vector<FeedPlan> PlanFeeds(std::span<const SequenceFeeds> batch, int64_t prefill_chunk,
                                int64_t draft_budget, int64_t target_budget);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_PASS_BUDGET_H_
