// The per-pass token budget's plan for one round (pass_budget.h), on hand-made batches whose
// expected plans are worked out in the comments. The scheduler test checks the same budget end to
// end, on the forward passes the workers actually run.
#include "services/coordinator/pass_budget.h"

#include <vector>

#include "gtest/gtest.h"

namespace specd {
namespace {

using Action = FeedPlan::Action;

// A sequence that calls both workers: `catch_up` on each, then `drafts` drafts.
SequenceFeeds Both(int64_t catch_up, int64_t drafts) {
  SequenceFeeds s;
  s.draft = WorkerFeed{true, catch_up, false, 0, drafts};
  s.target = WorkerFeed{true, catch_up, false, 0, drafts};
  return s;
}

// A decoding stream: one catch-up token (the last committed) and K drafts.
SequenceFeeds Decoding(int64_t k) { return Both(1, k); }

std::vector<FeedPlan> Plan(const std::vector<SequenceFeeds>& batch, int64_t chunk,
                           int64_t draft_budget, int64_t target_budget) {
  return PlanFeeds(batch, chunk, draft_budget, target_budget);
}

TEST(PassBudgetTest, WithoutABudgetEverySequenceRunsWithTheChunk) {
  for (const FeedPlan& p : Plan({Both(5000, 4), Decoding(4), Both(300, 0)}, 512, 0, 0)) {
    EXPECT_EQ(p.action, Action::kRun);
    EXPECT_EQ(p.draft_prefill_limit, 512);
    EXPECT_EQ(p.target_prefill_limit, 512);
  }
}

TEST(PassBudgetTest, APromptLongerThanTheChunkRunsAsWithoutABudgetWhenTheChunkFits) {
  // 512 + 4 drafts fit 4096: the worker feeds its chunk, or completes the prompt and drafts if
  // the rest is in its prefix cache, as it would without a budget.
  const std::vector<FeedPlan> plans = Plan({Both(5000, 4), Both(300, 4)}, 512, 4096, 4096);
  EXPECT_EQ(plans[0].action, Action::kRun);
  EXPECT_EQ(plans[0].draft_prefill_limit, 512);
  EXPECT_EQ(plans[0].target_prefill_limit, 512);
  EXPECT_EQ(plans[1].action, Action::kRun);
  // With 515 left on the target, 512 + 4 does not fit: both workers prefill the chunk alone.
  const std::vector<FeedPlan> cut = Plan({Both(5000, 4)}, 512, 4096, 515);
  EXPECT_EQ(cut[0].action, Action::kPrefillOnly);
  EXPECT_EQ(cut[0].target_prefill_limit, 512);
  EXPECT_EQ(cut[0].draft_prefill_limit, 512);
}

TEST(PassBudgetTest, RunningStreamsDecodeFirstAndPromptsShareWhatIsLeft) {
  // Budget 256 on both. The two streams take 1 + 4 each (10), though one comes last in the
  // batch; the first prompt prefills 246 of its 1000 tokens (chunk 512), leaving nothing, so the
  // second prompt waits.
  const std::vector<SequenceFeeds> batch = {Both(1000, 4), Decoding(4), Both(300, 4), Decoding(4)};
  const std::vector<FeedPlan> plans = PlanFeeds(batch, 512, 256, 256);
  ASSERT_EQ(plans.size(), 4u);
  EXPECT_EQ(plans[0].action, Action::kPrefillOnly);
  EXPECT_EQ(plans[0].draft_prefill_limit, 246);
  EXPECT_EQ(plans[0].target_prefill_limit, 246);
  EXPECT_EQ(plans[1].action, Action::kRun);
  EXPECT_EQ(plans[1].target_prefill_limit, 512);
  EXPECT_EQ(plans[2].action, Action::kWait);
  EXPECT_EQ(plans[3].action, Action::kRun);
}

TEST(PassBudgetTest, APromptThatFitsWholeRunsAndTheNextIsCut) {
  // Budget 300, chunk 0 (whole prompts): 200 + 4 drafts fit whole; the next prompt of 150 gets
  // the 96 left as a prefill chunk.
  const std::vector<FeedPlan> plans = Plan({Both(200, 4), Both(150, 4)}, 0, 300, 300);
  EXPECT_EQ(plans[0].action, Action::kRun);
  EXPECT_EQ(plans[0].target_prefill_limit, 0);
  EXPECT_EQ(plans[1].action, Action::kPrefillOnly);
  EXPECT_EQ(plans[1].target_prefill_limit, 96);
}

TEST(PassBudgetTest, AChunkNeverFeedsTheLastToken) {
  // 40 tokens do not fit with their drafts (40 + 64 > 100), so the sequence prefills: all but
  // the last token, which its whole round feeds next time.
  const std::vector<FeedPlan> plans = Plan({Both(40, 64)}, 512, 100, 100);
  EXPECT_EQ(plans[0].action, Action::kPrefillOnly);
  EXPECT_EQ(plans[0].target_prefill_limit, 39);
}

TEST(PassBudgetTest, EachWorkerIsCutByItsOwnBudget) {
  // The draft is behind (it restarted): 900 to catch up there, 2 on the target. The draft's
  // budget of 500 cuts its chunk; the target feeds all but its last token, and neither drafts
  // nor verifies until the draft has caught up.
  SequenceFeeds s = Both(2, 4);
  s.draft.catch_up = 900;
  const std::vector<FeedPlan> plans = Plan({s}, 512, 500, 4096);
  EXPECT_EQ(plans[0].action, Action::kPrefillOnly);
  EXPECT_EQ(plans[0].draft_prefill_limit, 500);
  EXPECT_EQ(plans[0].target_prefill_limit, 1);
}

TEST(PassBudgetTest, ACompanionCountsTwice) {
  // A guided sequence feeds its companion beside it: a budget of 150 is 75 for each half.
  SequenceFeeds s = Both(100, 4);
  s.target.companion = true;
  s.target.companion_catch_up = 120;
  s.draft.called = false;
  const std::vector<FeedPlan> plans = Plan({s}, 512, 150, 150);
  EXPECT_EQ(plans[0].action, Action::kPrefillOnly);
  EXPECT_EQ(plans[0].target_prefill_limit, 75);
  // A whole round of the pair: (1 + 1) catch-up + 2 * 4 drafts = 10 tokens.
  s.target.catch_up = s.target.companion_catch_up = 1;
  EXPECT_EQ(Plan({s, s}, 512, 150, 19)[1].action, Action::kWait);
  EXPECT_EQ(Plan({s, s}, 512, 150, 20)[1].action, Action::kRun);
}

TEST(PassBudgetTest, AWorkerNotCalledDoesNotLimit) {
  // Prompt lookup or K = 0: the draft worker is not called, so its budget does not apply.
  SequenceFeeds s = Both(300, 4);
  s.draft.called = false;
  const std::vector<FeedPlan> plans = Plan({s}, 512, 1, 1024);
  EXPECT_EQ(plans[0].action, Action::kRun);
}

TEST(PassBudgetTest, NoRoomOnOneWorkerMakesTheSequenceWait) {
  // The streams fill the draft's budget exactly (2 * 5), so the prompt cannot feed the draft a
  // token: it waits rather than prefill the target alone past the draft.
  const std::vector<FeedPlan> plans = Plan({Decoding(4), Decoding(4), Both(300, 4)}, 512, 10, 4096);
  EXPECT_EQ(plans[0].action, Action::kRun);
  EXPECT_EQ(plans[1].action, Action::kRun);
  EXPECT_EQ(plans[2].action, Action::kWait);
}

TEST(PassBudgetTest, StreamsLeftOutGoFirstInTheNextRound) {
  // Budget 10 holds two streams' rounds of 1 + 4. Batch order decides the first round; the
  // stream left out then goes first, so three streams take turns rather than the third waiting
  // for the first two to finish.
  std::vector<SequenceFeeds> batch = {Decoding(4), Decoding(4), Decoding(4)};
  std::vector<FeedPlan> plans = Plan(batch, 512, 10, 10);
  EXPECT_EQ(plans[0].action, Action::kRun);
  EXPECT_EQ(plans[1].action, Action::kRun);
  EXPECT_EQ(plans[2].action, Action::kWait);
  batch[2].rounds_left_out = 1;
  plans = Plan(batch, 512, 10, 10);
  EXPECT_EQ(plans[2].action, Action::kRun);
  EXPECT_EQ(plans[0].action, Action::kRun);
  EXPECT_EQ(plans[1].action, Action::kWait);
  // The longest left out goes first, then batch order among equals.
  batch[1].rounds_left_out = 2;
  plans = Plan(batch, 512, 10, 10);
  EXPECT_EQ(plans[1].action, Action::kRun);
  EXPECT_EQ(plans[2].action, Action::kRun);
  EXPECT_EQ(plans[0].action, Action::kWait);
}

TEST(PassBudgetTest, OnlyDecodingStreamsCountRoundsLeftOut) {
  const FeedPlan wait{Action::kWait, 0, 0};
  const FeedPlan run{Action::kRun, 512, 512};
  SequenceFeeds stream = Decoding(4);
  stream.rounds_left_out = 2;
  EXPECT_TRUE(specd::Decoding(stream));
  EXPECT_EQ(RoundsLeftOut(stream, wait), 3);
  EXPECT_EQ(RoundsLeftOut(stream, run), 0);
  // A prompt keeps its place in the batch: prompts prefill first come, first served.
  SequenceFeeds prompt = Both(300, 4);
  EXPECT_FALSE(specd::Decoding(prompt));
  EXPECT_EQ(RoundsLeftOut(prompt, wait), 0);
  // So does a stream replaying on a restarted draft, or one whose companion has catch-up left.
  SequenceFeeds replaying = Decoding(4);
  replaying.draft.catch_up = 40;
  EXPECT_FALSE(specd::Decoding(replaying));
  SequenceFeeds guided = Decoding(4);
  guided.target.companion = true;
  guided.target.companion_catch_up = 7;
  EXPECT_FALSE(specd::Decoding(guided));
  guided.target.companion_catch_up = 1;
  EXPECT_TRUE(specd::Decoding(guided));
  // A worker it does not call does not count; one that calls neither is not a stream.
  SequenceFeeds lookup = Decoding(4);
  lookup.draft = WorkerFeed{false, 900, false, 0, 0};
  EXPECT_TRUE(specd::Decoding(lookup));
  EXPECT_FALSE(specd::Decoding(SequenceFeeds()));
}

TEST(PassBudgetTest, WhenNothingFitsTheFirstSequenceRunsAnyway) {
  // A lone stream whose drafts alone exceed the budget still makes progress; beside one that
  // fits, it waits its turn.
  EXPECT_EQ(Plan({Decoding(64)}, 512, 32, 32)[0].action, Action::kRun);
  const std::vector<FeedPlan> plans = Plan({Decoding(64), Decoding(4)}, 512, 32, 32);
  EXPECT_EQ(plans[0].action, Action::kWait);
  EXPECT_EQ(plans[1].action, Action::kRun);
  // A sequence that calls no worker (it failed before the round) is not the one that runs.
  SequenceFeeds failed;
  const std::vector<FeedPlan> with_failed = Plan({failed, Decoding(64)}, 512, 32, 32);
  EXPECT_EQ(with_failed[1].action, Action::kRun);
  // First in turn: the one left out longest.
  std::vector<SequenceFeeds> turns = {Decoding(64), Decoding(64)};
  turns[1].rounds_left_out = 1;
  const std::vector<FeedPlan> in_turn = Plan(turns, 512, 32, 32);
  EXPECT_EQ(in_turn[0].action, Action::kWait);
  EXPECT_EQ(in_turn[1].action, Action::kRun);
}

}  // namespace
}  // namespace specd
