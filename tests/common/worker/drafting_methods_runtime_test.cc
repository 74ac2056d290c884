// The worker side of issue 17 against the independent oracle (worker_reference.h): draft trees
// (each node's children are the top-b of its path fed linearly; the target's rows for every node
// are its path's rows; only the accepted branch's KV stays), EGAG's entropies and stop, and a
// draft with a reduced classifier (FR-Spec).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "common/synth/synth.h"
#include "common/worker/worker_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/processed.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/worker/worker_model_suite.h"
#include "tests/common/worker/worker_reference.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using testing::RowOracle;
using testing::SameBits;
using testing::WorkerPrompt;

constexpr int64_t kVocab = testing::kWorkerTestVocab;

class DraftingRuntimeTest : public testing::WorkerModelSuite<> {
 protected:
  static std::unique_ptr<LlamaEngine> Engine(std::vector<int32_t> output_vocab = {}) {
    EngineOptions options;
    options.kv_capacity_tokens = 4096;
    LoadOptions load;
    load.output_vocab = std::move(output_vocab);
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine =
        CreateCpuEngine(model_dir(), 1, options, load);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }
  static std::unique_ptr<WorkerRuntime> Runtime(std::vector<int32_t> output_vocab = {}) {
    return std::make_unique<WorkerRuntime>(Engine(std::move(output_vocab)), WorkerRuntimeOptions{});
  }

  // The penalised logits of the token after `context`, from the oracle.
  std::vector<float> Penalized(const std::vector<int32_t>& context, int64_t prompt_len,
                               const SamplingParams& params) {
    const std::vector<float> logits = oracle_.Logits(context, context.size() - 1).at(0);
    const size_t prompt = std::min(context.size(), static_cast<size_t>(prompt_len));
    kernels::cpu::LogitsProcessor processor;
    std::vector<float> out(logits.size());
    EXPECT_TRUE(processor
                    .Penalize(logits, params,
                              {std::span<const int32_t>(context).subspan(0, prompt),
                               std::span<const int32_t>(context).subspan(prompt)},
                              out)
                    .ok());
    return out;
  }

  RowOracle oracle_{Engine()};
};

SamplingParams PenaltyParams() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  return p;
}

// Tokens from the root to `node`.
std::vector<int32_t> Path(const std::vector<int32_t>& nodes, const std::vector<int32_t>& parents,
                          int32_t node) {
  std::vector<int32_t> path;
  for (int32_t n = node; n >= 0; n = parents[static_cast<size_t>(n)]) {
    path.insert(path.begin(), nodes[static_cast<size_t>(n)]);
  }
  return path;
}

TEST_F(DraftingRuntimeTest, TreeChildrenAreTheTopBOfEachPathAndTheTargetScoresEveryNode) {
  const TreeShape shape{3, 2};
  constexpr int32_t kDepth = 3;
  const std::vector<int32_t> parents = TreeParents(shape, kDepth);
  for (const SamplingParams& params : {SamplingParams{.temperature = 0.0f}, PenaltyParams()}) {
    auto draft = Runtime();
    auto target = Runtime();
    const std::vector<int32_t> x = WorkerPrompt(19, params.greedy() ? 1 : 2);
    DraftSequenceRequest d;
    d.seq = 5;
    d.catch_up = x;
    d.num_speculative_tokens = kDepth;
    d.sampling = params;
    d.prompt_len = 11;
    d.tree = shape;
    std::vector<int32_t> nodes;
    const std::vector<SequenceOutcome> out =
        draft->Draft(std::vector<DraftSequenceRequest>{d}, [&](const DraftStep& step) {
          for (const DraftToken& t : step.tokens) nodes.push_back(t.token);
        });
    ASSERT_TRUE(out[0].status.ok()) << out[0].status;
    ASSERT_EQ(nodes.size(), parents.size());
    // Fed: every level but the last (3 + 9 nodes).
    EXPECT_EQ(out[0].cached_len, 19 + 12);
    // Each node's children: the top-b (or the argmax) of the row after its path, computed here
    // by a full sort of the oracle's penalised logits.
    for (int32_t row = 0; row <= static_cast<int32_t>(nodes.size()); ++row) {
      std::vector<int32_t> children;
      for (size_t i = 0; i < parents.size(); ++i) {
        if (parents[i] == row - 1) children.push_back(nodes[i]);
      }
      if (children.empty()) continue;
      std::vector<int32_t> context = x;
      if (row > 0) {
        const std::vector<int32_t> path = Path(nodes, parents, row - 1);
        context.insert(context.end(), path.begin(), path.end());
      }
      const std::vector<float> w = Penalized(context, 11, params);
      std::vector<int32_t> order(w.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return w[a] > w[b]; });
      order.resize(children.size());
      EXPECT_EQ(children, order) << "row " << row;
    }

    // The target verifies all 21 nodes (3 + 9 + 9) in one pass; each node's p and every row's
    // argmax are the rows of its path fed linearly.
    VerifySequenceRequest v;
    v.seq = 5;
    v.catch_up = x;
    v.drafts = nodes;
    v.tree_parents = parents;
    v.sampling = params;
    v.seed = 99;
    v.prompt_len = 11;
    v.num_candidates = 2;
    const std::vector<VerifySequenceResult> res =
        target->Verify(std::vector<VerifySequenceRequest>{v});
    ASSERT_TRUE(res[0].status.ok()) << res[0].status;
    EXPECT_EQ(res[0].cached_len, 19 + 21);
    ASSERT_EQ(res[0].argmax.size(), nodes.size() + 1);
    for (int32_t row = 0; row <= static_cast<int32_t>(nodes.size()); ++row) {
      std::vector<int32_t> context = x;
      if (row > 0) {
        const std::vector<int32_t> path = Path(nodes, parents, row - 1);
        context.insert(context.end(), path.begin(), path.end());
      }
      const std::vector<float> logits = oracle_.Logits(context, context.size() - 1).at(0);
      const std::vector<float> p = oracle_.Row(logits, context, 11, params);
      EXPECT_EQ(res[0].argmax[static_cast<size_t>(row)],
                oracle_.Greedy(logits, context, 11, params));
      for (size_t i = 0; i < parents.size(); ++i) {
        if (parents[i] != row - 1) continue;
        EXPECT_TRUE(SameBits(res[0].p_draft[i], p[static_cast<size_t>(nodes[i])])) << "node " << i;
      }
    }
    if (!params.greedy()) {
      EXPECT_EQ(res[0].candidate_tokens.size(), 1u + 3u + 9u);  // rows with a child
      EXPECT_EQ(res[0].leaf_bonus.size(), 9u);                  // the depth-3 nodes
    }
  }
}

// After a tree round the accepted branch's KV moves into place: the next Verify, carrying the
// compaction, scores exactly what a sequence fed x + branch linearly scores, and the sequence
// holds only x + branch (its blocks included).
TEST_F(DraftingRuntimeTest, CompactionKeepsOnlyTheAcceptedBranch) {
  auto target = Runtime();
  const std::vector<int32_t> x = WorkerPrompt(30, 7);
  const std::vector<int32_t> nodes = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  const std::vector<int32_t> parents = TreeParents({2, 2}, 3);  // 2 + 4 + 4 nodes
  const SamplingParams greedy{.temperature = 0.0f};
  VerifySequenceRequest v;
  v.seq = 1;
  v.catch_up = x;
  v.drafts = nodes;
  v.tree_parents = parents;
  v.sampling = greedy;
  v.prompt_len = 30;
  ASSERT_TRUE(target->Verify(std::vector<VerifySequenceRequest>{v})[0].status.ok());
  EXPECT_EQ(*target->CachedLength(1), 40);
  // Accept node 1 (level 1), node 5 (its second child) and node 9 (its continuation), then a
  // correction token 77.
  const std::vector<int32_t> branch = {1, 5, 9};
  std::vector<int32_t> committed = x;
  for (const int32_t n : branch) committed.push_back(nodes[static_cast<size_t>(n)]);
  committed.push_back(77);
  VerifySequenceRequest next;
  next.seq = 1;
  next.catch_up = {77};
  next.expected_cached_len = 33;
  next.drop_tail = true;
  next.compact = {30, branch};
  next.sampling = greedy;
  next.prompt_len = 30;
  next.drafts = {3, 4};
  const std::vector<VerifySequenceResult> res =
      target->Verify(std::vector<VerifySequenceRequest>{next});
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(res[0].cached_len, 36);
  EXPECT_EQ(target->engine().kv().used_blocks(), (36 + 15) / 16);
  const testing::ExpectedVerify want =
      testing::ReferenceVerify(oracle_, committed, 30, {3, 4}, greedy, 0, 0);
  EXPECT_EQ(res[0].argmax, want.argmax);
  EXPECT_TRUE(SameBits(res[0].p_draft, want.p_draft));
  absl::StatusOr<ProbRow> row = target->ReadRow(1, 1);
  ASSERT_TRUE(row.ok());
  // A bad compaction is refused and changes nothing.
  VerifySequenceRequest bad = next;
  bad.expected_cached_len = 36;
  bad.catch_up = {5};
  bad.compact = {30, {2, 1}};
  bad.compact.kept_nodes.push_back(3);
  bad.compact.tree_start = 33;
  EXPECT_FALSE(target->Verify(std::vector<VerifySequenceRequest>{bad})[0].status.ok());
  ASSERT_TRUE(target->Release(1).ok());
  EXPECT_EQ(target->engine().kv().used_blocks(), 0);
}

// EGAG: each step reports the normalized entropy of the draft's raw logits (fp64 softmax here),
// and the draft stops after the first step k >= min_tokens whose entropy exceeds the threshold.
TEST_F(DraftingRuntimeTest, EntropyIsReportedAndStopsTheDraft) {
  auto draft = Runtime();
  const std::vector<int32_t> x = WorkerPrompt(12, 3);
  SamplingParams params;
  params.temperature = 0.0f;  // the entropy is the raw logits' whatever the sampling
  DraftSequenceRequest d;
  d.seq = 2;
  d.catch_up = x;
  d.num_speculative_tokens = 8;
  d.sampling = params;
  d.prompt_len = 12;
  d.entropy_stop = {true, 2, 1.0f};  // no normalized entropy exceeds 1: no stop
  std::vector<DraftToken> tokens;
  auto collect = [&](const DraftStep& step) {
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
  };
  ASSERT_TRUE(draft->Draft(std::vector<DraftSequenceRequest>{d}, collect)[0].status.ok());
  ASSERT_EQ(tokens.size(), 8u);
  std::vector<int32_t> context = x;
  std::vector<float> entropies;
  for (const DraftToken& t : tokens) {
    const std::vector<float> logits = oracle_.Logits(context, context.size() - 1).at(0);
    const double m = *std::max_element(logits.begin(), logits.end());
    double sum = 0, weighted = 0;
    for (const float l : logits) {
      sum += std::exp(l - m);
      weighted += std::exp(l - m) * (l - m);
    }
    const double h = (std::log(sum) - weighted / sum) / std::log(static_cast<double>(kVocab));
    EXPECT_NEAR(t.entropy, h, 1e-5);
    entropies.push_back(t.entropy);
    context.push_back(t.token);
  }
  // A threshold between the entropies: the draft stops right after the first step >= 2 above it.
  std::vector<float> sorted = entropies;
  std::sort(sorted.begin(), sorted.end());
  const float threshold = (sorted[3] + sorted[4]) / 2;
  size_t stop = 8;
  for (size_t k = 1; k < entropies.size(); ++k) {
    if (entropies[k] > threshold) {
      stop = k + 1;
      break;
    }
  }
  ASSERT_TRUE(draft->Release(2).ok());
  d.entropy_stop.threshold = threshold;
  tokens.clear();
  const std::vector<SequenceOutcome> out =
      draft->Draft(std::vector<DraftSequenceRequest>{d}, collect);
  ASSERT_TRUE(out[0].status.ok());
  EXPECT_EQ(tokens.size(), stop);
  EXPECT_LT(stop, 8u) << "no step was above the threshold: the stop was not exercised";
  EXPECT_EQ(out[0].cached_len, static_cast<int64_t>(12 + stop - 1));
}

// FR-Spec: a draft whose classifier keeps 40 of the 300 tokens samples only those, its rows are
// the processed distribution of the kept logits (token ids in ReadRow, 0 elsewhere), and it
// refuses to verify.
TEST_F(DraftingRuntimeTest, ReducedHeadDraftsOverItsTokensOnly) {
  std::vector<int32_t> kept;
  for (int32_t t = 0; t < kVocab; t += 7) kept.push_back(t);
  kept.resize(40);
  auto draft = Runtime(kept);
  EXPECT_EQ(draft->output_vocab().width(), 40);
  const std::vector<int32_t> x = WorkerPrompt(15, 9);
  const SamplingParams params = PenaltyParams();
  DraftSequenceRequest d;
  d.seq = 3;
  d.catch_up = x;
  d.num_speculative_tokens = 4;
  d.sampling = params;
  d.seed = 1234;
  d.prompt_len = 10;
  std::vector<DraftToken> tokens;
  ASSERT_TRUE(draft
                  ->Draft(std::vector<DraftSequenceRequest>{d},
                          [&](const DraftStep& step) {
                            tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
                          })[0]
                  .status.ok());
  std::vector<int32_t> context = x;
  for (size_t k = 0; k < tokens.size(); ++k) {
    EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), tokens[k].token));
    // The oracle: the full logits restricted to the kept tokens, then the processed
    // distribution over those, with the history restricted likewise.
    const std::vector<float> full = oracle_.Logits(context, context.size() - 1).at(0);
    std::vector<float> logits;
    for (const int32_t t : kept) logits.push_back(full[static_cast<size_t>(t)]);
    std::vector<int32_t> prompt, output;
    for (size_t i = 0; i < context.size(); ++i) {
      const auto at = std::lower_bound(kept.begin(), kept.end(), context[i]);
      if (at == kept.end() || *at != context[i]) continue;
      (i < 10 ? prompt : output).push_back(static_cast<int32_t>(at - kept.begin()));
    }
    std::vector<float> want(kept.size());
    kernels::cpu::LogitsProcessor processor;
    ASSERT_TRUE(processor.ProcessedDistribution(logits, params, {prompt, output}, want).ok());
    absl::StatusOr<ProbRow> row = draft->ReadRow(3, static_cast<int32_t>(k + 1));
    ASSERT_TRUE(row.ok()) << row.status();
    ASSERT_FALSE(row->dense());
    std::vector<float> got(kept.size(), 0.0f);
    for (size_t j = 0; j < row->ids.size(); ++j) {
      const auto at = std::lower_bound(kept.begin(), kept.end(), row->ids[j]);
      ASSERT_TRUE(at != kept.end() && *at == row->ids[j]) << "a token outside the head";
      got[static_cast<size_t>(at - kept.begin())] = row->probs[j];
    }
    EXPECT_TRUE(SameBits(got, want)) << "step " << k + 1;
    context.push_back(tokens[k].token);
  }
  // q(y) of a token outside the head is 0; of one inside, its row entry.
  absl::StatusOr<TruncateResult> q = draft->Truncate(testing::Trunc(3, 15, 1, {1, kept[5]}));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->q_probs[0], 0.0f);
  VerifySequenceRequest v;
  v.seq = 4;
  v.catch_up = x;
  v.sampling = params;
  v.prompt_len = 10;
  const std::vector<VerifySequenceResult> res =
      draft->Verify(std::vector<VerifySequenceRequest>{v});
  EXPECT_EQ(res[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(res[0].status.message(), HasSubstr("keeps 40 of 300 tokens"));
}

}  // namespace
}  // namespace specd
