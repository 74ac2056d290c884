#include "services/coordinator/prefix_sharing.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace specd {
namespace {

constexpr int64_t kBlock = 16;

// `n` tokens: `shared` of a common stem, then ones that depend on `tag`.
std::vector<int32_t> Prompt(int64_t n, int64_t shared, int32_t tag) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) {
    p.push_back(i < shared ? static_cast<int32_t>(3 + i % 97)
                           : 1000 * tag + static_cast<int32_t>(i));
  }
  return p;
}

SpeculativeSequence Seq(std::vector<int32_t> tokens, int64_t target_cached = 0) {
  SpeculativeSequence s;
  s.prompt_len = static_cast<int64_t>(tokens.size());
  s.tokens = std::move(tokens);
  s.target_cached = target_cached;
  return s;
}

// `known` null: the target caches no prefixes. By default nothing is known computed.
std::vector<bool> Waits(const std::vector<SpeculativeSequence>& seqs,
                        const ComputedPrefixes* known) {
  std::vector<const SpeculativeSequence*> batch;
  for (const SpeculativeSequence& s : seqs) batch.push_back(&s);
  return WaitsForSharedPrefix(batch, known);
}

std::vector<bool> Waits(const std::vector<SpeculativeSequence>& seqs) {
  const ComputedPrefixes nothing_known(kBlock, 1024);
  return Waits(seqs, &nothing_known);
}

TEST(PrefixSharingTest, CompletionsOfOnePromptWaitForTheFirstToComputeIt) {
  const std::vector<int32_t> prompt = Prompt(100, 100, 0);
  const std::vector<SpeculativeSequence> seqs = {Seq(prompt), Seq(prompt), Seq(prompt),
                                                 Seq(prompt)};
  EXPECT_EQ(Waits(seqs), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(Waits(seqs, nullptr), (std::vector<bool>(4, false))) << "no prefix cache";
}

TEST(PrefixSharingTest, OnlyWholeBlocksOfAtLeastThirtyTwoTokensCount) {
  // The common stem in whole blocks of 16: 47 -> 32 (waits), 31 -> 16 (does not).
  for (const auto& [stem, waits] : std::vector<std::pair<int64_t, bool>>{
           {47, true}, {40, true}, {32, true}, {31, false}, {16, false}}) {
    const std::vector<SpeculativeSequence> seqs = {Seq(Prompt(80, stem, 1)),
                                                   Seq(Prompt(90, stem, 2))};
    EXPECT_EQ(Waits(seqs), (std::vector<bool>{false, waits})) << "stem " << stem;
  }
  // The follower's last token is always fed, so it is never shared: identical prompts of 33
  // tokens share 32, of 32 tokens only 16.
  EXPECT_EQ(Waits({Seq(Prompt(33, 33, 0)), Seq(Prompt(33, 33, 0))}),
            (std::vector<bool>{false, true}));
  EXPECT_EQ(Waits({Seq(Prompt(32, 32, 0)), Seq(Prompt(32, 32, 0))}),
            (std::vector<bool>{false, false}));
}

TEST(PrefixSharingTest, NobodyWaitsForBlocksAlreadyComputed) {
  const std::vector<int32_t> prompt = Prompt(200, 200, 0);
  // The leader is past the whole shared span (chunked prefill): its blocks are cached.
  EXPECT_EQ(Waits({Seq(prompt, 192), Seq(prompt)}), (std::vector<bool>{false, false}));
  // Still computing them: the one behind waits, whichever came first.
  EXPECT_EQ(Waits({Seq(prompt), Seq(prompt, 64)}), (std::vector<bool>{true, false}));
  // Less than 32 tokens left to share beyond what the follower holds: not worth a round.
  EXPECT_EQ(Waits({Seq(prompt, 176), Seq(prompt, 176)}), (std::vector<bool>{false, false}));
}

TEST(PrefixSharingTest, DecodingStreamsAndScoredPromptsNeverWaitOrLead) {
  const std::vector<int32_t> prompt = Prompt(100, 100, 0);
  // A decoding stream catches up one token: it neither waits nor computes prompt blocks.
  SpeculativeSequence decoding = Seq(prompt, 99);
  SpeculativeSequence scored = Seq(prompt);
  scored.prompt_logprobs.mode = LogprobsMode::kRaw;
  EXPECT_EQ(Waits({decoding, scored, Seq(prompt)}), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(Waits({scored, Seq(prompt), Seq(prompt)}), (std::vector<bool>{false, false, true}));
}

TEST(PrefixSharingTest, DifferentPromptsEachComputeTheirOwn) {
  const std::vector<SpeculativeSequence> seqs = {Seq(Prompt(100, 0, 1)), Seq(Prompt(100, 0, 2)),
                                                 Seq(Prompt(100, 100, 0)),
                                                 Seq(Prompt(120, 100, 3))};
  EXPECT_EQ(Waits(seqs), (std::vector<bool>{false, false, false, true}));
}

}  // namespace
}  // namespace specd

namespace specd {
namespace {

TEST(ComputedPrefixesTest, KnowsTheWholeBlocksRecordedAndWhatFollowsThem) {
  ComputedPrefixes known(kBlock, 1024);
  const std::vector<int32_t> a = Prompt(100, 100, 0);
  std::vector<uint64_t> chain;
  known.Record(a, 40, chain);  // 2 whole blocks of the 40 tokens held
  EXPECT_EQ(chain.size(), 2u);
  EXPECT_EQ(known.KnownPrefix(a, 99), 32);
  known.Record(a, 99, chain);  // a round later: 6 blocks, only the new 4 hashed
  EXPECT_EQ(chain.size(), 6u);
  EXPECT_EQ(known.size(), 6);
  EXPECT_EQ(known.KnownPrefix(a, 99), 96);
  EXPECT_EQ(known.KnownPrefix(a, 95), 80) << "at most max_tokens, in whole blocks";
  // Another prompt is known as far as it begins the same way, block by block: a block's hash
  // chains over everything before it.
  EXPECT_EQ(known.KnownPrefix(Prompt(100, 50, 1), 99), 48);
  std::vector<int32_t> other_start = a;
  other_start[0] += 1;
  EXPECT_EQ(known.KnownPrefix(other_start, 99), 0);
  known.Clear();
  EXPECT_EQ(known.KnownPrefix(a, 99), 0);
}

TEST(ComputedPrefixesTest, ForgetsTheLeastRecentlySeenBlocksBeyondItsCapacity) {
  ComputedPrefixes known(kBlock, 8);
  const std::vector<int32_t> first = Prompt(64, 0, 1);
  const std::vector<int32_t> second = Prompt(64, 0, 2);
  const std::vector<int32_t> third = Prompt(64, 0, 3);
  std::vector<uint64_t> c1, c2, c3;
  known.Record(first, 64, c1);
  known.Record(second, 64, c2);
  EXPECT_EQ(known.KnownPrefix(first, 64), 64);
  known.Touch(c1);  // the first finished after the second was computed
  known.Record(third, 64, c3);
  EXPECT_EQ(known.size(), 8);
  EXPECT_EQ(known.KnownPrefix(first, 64), 64);
  EXPECT_EQ(known.KnownPrefix(second, 64), 0) << "its blocks were the least recently seen";
  EXPECT_EQ(known.KnownPrefix(third, 64), 64);
}

// Requests behind a system prompt the target computed long ago each take it from the cache at
// once: none waits for another, while a new shared span still makes one wait.
TEST(PrefixSharingTest, NobodyWaitsForBlocksTheTargetIsKnownToHold) {
  ComputedPrefixes known(kBlock, 1024);
  const std::vector<int32_t> system = Prompt(160, 160, 0);
  std::vector<uint64_t> chain;
  known.Record(system, 160, chain);
  const std::vector<SpeculativeSequence> seqs = {Seq(Prompt(240, 160, 1)),
                                                 Seq(Prompt(230, 160, 2))};
  EXPECT_EQ(Waits(seqs, &known), (std::vector<bool>{false, false}));
  EXPECT_EQ(Waits(seqs), (std::vector<bool>{false, true})) << "nothing known: one waits";
  // Both continue the cached system prompt with the same 64 new tokens: one computes them.
  std::vector<int32_t> longer = Prompt(224, 224, 0);
  longer.push_back(7000);
  std::vector<int32_t> other = Prompt(224, 224, 0);
  other.push_back(8000);
  EXPECT_EQ(Waits({Seq(longer), Seq(other)}, &known), (std::vector<bool>{false, true}));
}

}  // namespace
}  // namespace specd
