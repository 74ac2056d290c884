// Distribution exactness of speculative sampling, end to end over in-process workers: on a
// synthetic pair with a 16-token vocabulary, the joint distribution of the first three generated
// tokens matches the target's exact distribution, computed in closed form by an independent numpy
// reference (joint_reference.py). Pearson's chi-square with fixed seeds and 20000 samples;
// exactness is rejected at p < 1e-4.
//
// Every way of drafting is held to it (issue 17): a sampled chain from the draft model, prompt
// lookup, EGAG's entropy-cut chains, a draft with a reduced head (FR-Spec), and trees with b = 2
// and 3 for sampled and greedy requests (greedy output is a point mass, so 200 requests do), and
// requests with a logit_bias (the reference adds it to its logits). Each
// run asserts minimum counts showing that its method was exercised (rejections, accepted drafts,
// prompt-lookup matches, EGAG stops, accepted second-ranked children). And for each, a deliberately
// broken variant must be rejected by the same test, which shows it has power:
//  * chains and FR-Spec: the correction drawn from p instead of norm(max(0, p - q));
//  * prompt lookup: drafts accepted with probability 2 p(t) instead of p(t);
//  * EGAG: a draft length that peeks at the acceptance uniforms (K is no longer a stopping time);
//  * trees: child x_c accepted with p(x_c) instead of p'(x_c) = p(x_c) / (1 - rejected mass);
//    for greedy requests, the first child followed as if it were the target's argmax.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/philox.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "services/coordinator/speculation_round.h"
#include "tests/base/chi_square.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/services/coordinator/forwarding_worker.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

constexpr int kVocab = 16;
constexpr int kSamples = 20000;
constexpr double kAlpha = 1e-4;

// Answers q(y) = 0 for every residual query, so the coordinator takes the first candidate y ~ p:
// the classic bug of sampling the correction from p.
class BrokenResidualDraft final : public testing::ForwardingWorker {
 public:
  using ForwardingWorker::ForwardingWorker;
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override {
    absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> r = inner_.Truncate(batch);
    if (r.ok()) {
      for (SequenceAnswer<TruncateResult>& a : *r) {
        if (a.value.ok()) std::fill(a.value->q_probs.begin(), a.value->q_probs.end(), 0.0f);
      }
    }
    return r;
  }
};

// EGAG gone wrong: the draft stops before the first draft (past EGAG's minimum) whose acceptance
// uniform is above 1/2, so the drafts that are verified are the ones likely to be accepted.
class PeekingDraft final : public testing::ForwardingWorker {
 public:
  using ForwardingWorker::ForwardingWorker;
  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    absl::flat_hash_map<SeqId, std::pair<uint64_t, uint32_t>> at;  // seed, next position
    absl::flat_hash_map<SeqId, int> least;
    for (const DraftSequenceRequest& r : batch) {
      at[r.seq] = {r.seed, static_cast<uint32_t>(r.expected_cached_len + r.catch_up.size())};
      least[r.seq] = r.entropy_stop.min_tokens;
    }
    absl::flat_hash_map<SeqId, bool> cut;
    absl::flat_hash_map<SeqId, int> drafted;
    return inner_.Draft(batch, [&](const DraftStep& step) {
      std::vector<DraftToken> kept;
      for (const DraftToken& t : step.tokens) {
        auto& [seed, position] = at[t.seq];
        if (cut[t.seq]) continue;
        if (drafted[t.seq] >= least[t.seq] &&
            StreamUniform(seed, position, Purpose::kAccept) > 0.5) {
          cut[t.seq] = true;
          continue;
        }
        ++drafted[t.seq];
        ++position;
        kept.push_back(t);
      }
      DraftStep copy = step;
      copy.tokens = kept;
      on_step(copy);
    });
  }
};

// Three broken targets. Prompt lookup: every draft looks twice as likely to the coordinator, so it
// is accepted with 2 p(t). Trees: child x_c's p is scaled by (1 - the mass of the siblings tried
// before it), which turns the coordinator's u (1 - R) < p' (1 - R) test into u < p(x_c): the
// renormalisation after rejected children is forgotten. Greedy trees: the first child is always
// followed, as if it were the target's argmax.
class BrokenTarget final : public testing::ForwardingWorker {
 public:
  enum class Bug { kDoubleP, kNoRenormalisation, kFirstChild };
  BrokenTarget(WorkerApi& inner, Bug bug) : ForwardingWorker(inner), bug_(bug) {}
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    absl::StatusOr<std::vector<VerifySequenceResult>> out = inner_.Verify(batch);
    if (!out.ok()) return out;
    for (size_t i = 0; i < out->size(); ++i) {
      std::vector<float>& p = (*out)[i].p_draft;
      if (bug_ == Bug::kDoubleP) {
        for (float& x : p) x = std::min(1.0f, 2.0f * x);
        continue;
      }
      const std::vector<int32_t>& parents = batch[i].tree_parents;
      if (bug_ == Bug::kFirstChild) {
        // Greedy: every row's argmax becomes its first child, which is then always followed.
        std::vector<bool> done((*out)[i].argmax.size(), false);
        for (size_t node = 0; node < parents.size(); ++node) {
          const size_t row = static_cast<size_t>(parents[node] + 1);
          if (done[row]) continue;
          done[row] = true;
          (*out)[i].argmax[row] = batch[i].drafts[node];
        }
        continue;
      }
      std::vector<float> original = p;
      for (size_t node = 0; node < p.size(); ++node) {
        double before = 0.0;  // the earlier siblings' mass
        for (size_t sib = 0; sib < node; ++sib) {
          if (parents[sib] == parents[node]) before += original[sib];
        }
        p[node] = static_cast<float>(original[node] * (1.0 - before));
      }
    }
    return out;
  }

 private:
  Bug bug_;
};

enum class Broken { kResidual, kDoubleP, kPeek, kNoRenormalisation, kFirstChild };

struct Setting {
  std::string name;
  float temperature;
  int32_t top_k;
  float top_p;
  int32_t k;
  DraftMethod method = DraftMethod::kModel;
  TreeShape tree = {};  // a chain
  bool egag = false;
  bool reduced_head = false;  // the draft keeps 10 of the 16 classifier rows (FR-Spec)
  std::vector<int32_t> prompt = {1, 7, 3};
  Broken broken = Broken::kResidual;
  int samples = kSamples;
  EgagOptions egag_options = {0.5, 0.96, 1};
  std::vector<TokenBias> bias = {};      // the requests' logit_bias
  std::vector<int32_t> prediction = {};  // kNgram: drafts looked up in it
};
void PrintTo(const Setting& s, std::ostream* os) { *os << s.name; }

// What a run did, to show it exercised its method.
struct Exercised {
  int64_t rejections = 0;  // rounds that ended in a rejected draft (or all children rejected)
  int64_t accepted = 0;    // accepted drafts
  int64_t drafting = 0;    // rounds that drafted (for prompt lookup: that found a match)
  int64_t egag_stops = 0;
  int64_t later_children = 0;  // accepted tree children that were not the first tried
};

class DistributionTest : public ::testing::TestWithParam<Setting> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const SynthSpec spec = testing::ChiSquareTestSpec();
    ASSERT_EQ(spec.config.vocab_size, kVocab);
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  // joint_reference.py's BIAS argument.
  static std::string BiasArgument(const std::vector<TokenBias>& bias) {
    if (bias.empty()) return "-";
    return absl::StrJoin(bias, ",", [](std::string* out, const TokenBias& b) {
      absl::StrAppend(out, b.token, ":", b.bias);
    });
  }

  static std::vector<double> Reference(const Setting& s) {
    return testing::RunF64Reference(
        "tests/services/coordinator/joint_reference.py", dir_->path(),
        dir_->path() / (s.name + ".f64"),
        absl::StrCat(s.temperature, " ", s.top_k, " ", s.top_p, " ", BiasArgument(s.bias), " ",
                     absl::StrJoin(s.prompt, " ")),
        kVocab * kVocab * kVocab);
  }

  // Counts of the first three tokens over the setting's requests with different seeds.
  static std::vector<int64_t> Sample(const Setting& s, bool broken, Exercised* seen) {
    auto target = MakeWorker(0, false);
    auto draft = MakeWorker(1, s.reduced_head);
    BrokenResidualDraft broken_residual(*draft);
    PeekingDraft peeking(*draft);
    BrokenTarget double_p(*target, BrokenTarget::Bug::kDoubleP);
    BrokenTarget no_renorm(*target, BrokenTarget::Bug::kNoRenormalisation);
    BrokenTarget first_child(*target, BrokenTarget::Bug::kFirstChild);
    WorkerApi* d = draft.get();
    WorkerApi* t = target.get();
    if (broken) {
      switch (s.broken) {
        case Broken::kResidual:
          d = &broken_residual;
          break;
        case Broken::kPeek:
          d = &peeking;
          break;
        case Broken::kDoubleP:
          t = &double_p;
          break;
        case Broken::kNoRenormalisation:
          t = &no_renorm;
          break;
        case Broken::kFirstChild:
          t = &first_child;
          break;
      }
    }
    std::vector<int64_t> counts(kVocab * kVocab * kVocab, 0);
    constexpr int kBatch = 1000;
    for (int base = 0; base < s.samples; base += kBatch) {
      const int n = std::min(kBatch, s.samples - base);
      std::vector<SpeculativeSequence> seqs(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        SpeculativeSequence& q = seqs[static_cast<size_t>(i)];
        q.id = static_cast<uint64_t>(base + i + 1);
        q.tokens = s.prompt;
        q.prompt_len = static_cast<int64_t>(s.prompt.size());
        q.seed = 0x5eed0000ULL + static_cast<uint64_t>(base + i);
        q.sampling.temperature = s.temperature;
        q.sampling.top_k = s.top_k;
        q.sampling.top_p = s.top_p;
        q.logit_bias = s.bias;
        q.num_speculative_tokens = s.k;
        q.num_candidates = 2;
        q.draft_method = s.method;
        q.ngram = {1, 2};
        q.prediction = s.prediction;
        q.tree = s.tree;
        q.egag.enabled = s.egag;
        q.egag.options = s.egag_options;
      }
      const size_t p = s.prompt.size();
      while (true) {
        std::vector<SpeculativeSequence*> running;
        for (auto& q : seqs) {
          if (q.tokens.size() < p + 3) running.push_back(&q);
        }
        if (running.empty()) break;
        for (const RoundStats& st : RunSpeculationRound(*d, *t, running, RoundOptions{32})) {
          EXPECT_TRUE(st.status.ok()) << st.status;
          seen->rejections += st.accepted < st.drafted;
          seen->accepted += st.accepted;
          seen->drafting += st.drafted > 0;
          seen->egag_stops += st.entropy_stopped;
          seen->later_children += st.later_children_accepted;
        }
      }
      for (auto& q : seqs) {
        ++counts[static_cast<size_t>(q.tokens[p] * kVocab * kVocab + q.tokens[p + 1] * kVocab +
                                     q.tokens[p + 2])];
        EXPECT_TRUE(target->Release(q.id).ok());
        if (q.uses_draft_worker()) {
          EXPECT_TRUE(draft->Release(q.id).ok());
        }
      }
    }
    EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
    EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0);
    return counts;
  }

  static std::unique_ptr<LocalWorker> MakeWorker(int64_t exit_layer, bool reduced_head) {
    EngineOptions options;
    options.kv_capacity_tokens = 16 * 1024;
    LoadOptions load;
    load.exit_layer = exit_layer;
    // 10 of the 16 tokens; the target's likeliest tokens here include some left out.
    if (reduced_head) load.output_vocab = {0, 2, 3, 4, 6, 7, 9, 11, 12, 14};
    // On testing::TestBackend, so that scripts/gpu/device_check.sh runs it on the GPU.
    return std::make_unique<LocalWorker>(std::make_unique<WorkerRuntime>(
        testing::MakeTestEngine(dir_->path(), 2, options, load), WorkerRuntimeOptions{}));
  }

  static double PValue(const Setting& s, const std::vector<int64_t>& counts,
                       const std::vector<double>& joint) {
    std::vector<double> expected;
    for (const double pr : joint) expected.push_back(pr * s.samples);
    int64_t impossible = 0;
    for (size_t i = 0; i < joint.size(); ++i) impossible += joint[i] == 0.0 ? counts[i] : 0;
    if (impossible > 0) return 0.0;  // a token the target never emits: certainly not exact
    return testing::PearsonChiSquare(counts, expected).p_value;
  }

  static inline ScopedTempDir* dir_ = nullptr;
};

TEST_P(DistributionTest, FirstThreeTokensHaveTheTargetsJointDistribution) {
  const Setting& s = GetParam();
  const std::vector<double> joint = Reference(s);
  Exercised seen;
  const std::vector<int64_t> counts = Sample(s, /*broken=*/false, &seen);
  const double pv = PValue(s, counts, joint);
  std::printf(
      "[%s] chi-square p-value %.4f (%lld drafting rounds, %lld ended in a rejection, %lld "
      "drafts accepted, %lld EGAG stops, %lld later children accepted)\n",
      s.name.c_str(), pv, static_cast<long long>(seen.drafting),
      static_cast<long long>(seen.rejections), static_cast<long long>(seen.accepted),
      static_cast<long long>(seen.egag_stops), static_cast<long long>(seen.later_children));
  EXPECT_GT(pv, kAlpha);
  // The method was exercised: enough rejections and acceptances to matter, and its own events.
  EXPECT_GT(seen.rejections, s.samples / 10) << "too few rejections for a meaningful test";
  EXPECT_GT(seen.accepted, s.samples / 10) << "too few accepted drafts";
  if (s.method == DraftMethod::kNgram) {
    EXPECT_GT(seen.drafting, s.samples / 2) << "prompt lookup hardly ever matched";
  }
  if (s.egag) {
    EXPECT_GT(seen.egag_stops, s.samples / 10) << "EGAG hardly ever stopped a draft";
  }
  if (s.tree.is_tree()) {
    // Sampled: p' is exercised. Greedy: the tree, not its first chain, made the output.
    EXPECT_GT(seen.later_children, s.temperature > 0.0f ? s.samples / 20 : 0)
        << "children after the first were hardly ever accepted";
  }
}

TEST_P(DistributionTest, BrokenVariantIsDetected) {
  const Setting& s = GetParam();
  const std::vector<double> joint = Reference(s);
  Exercised seen;
  const double pv = PValue(s, Sample(s, /*broken=*/true, &seen), joint);
  std::printf("[%s, broken] chi-square p-value %.3g\n", s.name.c_str(), pv);
  EXPECT_LT(pv, kAlpha);
}

// A chain of model drafts for requests with a logit_bias; `reduced_head` as in FR-Spec.
Setting Biased(std::string name, float temperature, int32_t top_k, int32_t k, bool reduced_head,
               std::vector<TokenBias> bias) {
  Setting s{std::move(name), temperature, top_k, 1.0f, k};
  s.reduced_head = reduced_head;
  s.bias = std::move(bias);
  return s;
}

// Drafts looked up in a prediction (OpenAI's predicted outputs), with a broken target.
Setting Predicted(std::string name, float temperature, int32_t top_k, float top_p, int32_t k,
                  std::vector<int32_t> prediction) {
  Setting s{std::move(name), temperature, top_k, top_p, k, DraftMethod::kNgram};
  s.broken = Broken::kDoubleP;
  s.prediction = std::move(prediction);
  return s;
}

// Prompt lookup needs a text that repeats itself: "7 3 5" twice, so the suffix "7 3" has an
// earlier occurrence to continue from.
const std::vector<int32_t> kRepeating = {1, 7, 3, 5, 7, 3, 5, 7, 3};

INSTANTIATE_TEST_SUITE_P(
    Settings, DistributionTest,
    ::testing::Values(Setting{"temperature1_k2", 1.0f, 0, 1.0f, 2},
                      Setting{"topk6_topp09_k3", 1.0f, 6, 0.9f, 3},
                      Setting{"temperature07_topp08_k1", 0.7f, 0, 0.8f, 1},
                      Setting{"ngram_temperature1_k3",
                              1.0f,
                              0,
                              1.0f,
                              3,
                              DraftMethod::kNgram,
                              {},
                              false,
                              false,
                              kRepeating,
                              Broken::kDoubleP},
                      Setting{"ngram_topk6_topp09_k2",
                              1.0f,
                              6,
                              0.9f,
                              2,
                              DraftMethod::kNgram,
                              {},
                              false,
                              false,
                              kRepeating,
                              Broken::kDoubleP},
                      Setting{"egag_temperature1_k6",
                              1.0f,
                              0,
                              1.0f,
                              6,
                              DraftMethod::kModel,
                              {},
                              true,
                              false,
                              {1, 7, 3},
                              Broken::kPeek},
                      Setting{"frspec_temperature1_k2",
                              1.0f,
                              0,
                              1.0f,
                              2,
                              DraftMethod::kModel,
                              {},
                              false,
                              true,
                              {1, 7, 3},
                              Broken::kResidual},
                      Setting{"tree_b2_d2_temperature07_k3",
                              0.7f,
                              0,
                              1.0f,
                              3,
                              DraftMethod::kModel,
                              {2, 2},
                              false,
                              false,
                              {1, 7, 3},
                              Broken::kNoRenormalisation},
                      Setting{"tree_b3_d1_topk6_topp09_k2",
                              1.0f,
                              6,
                              0.9f,
                              2,
                              DraftMethod::kModel,
                              {3, 1},
                              false,
                              false,
                              {1, 7, 3},
                              Broken::kNoRenormalisation},
                      Setting{"tree_b2_d1_greedy_k4",
                              0.0f,
                              0,
                              1.0f,
                              4,
                              DraftMethod::kModel,
                              {2, 1},
                              false,
                              false,
                              {1, 7, 3},
                              Broken::kFirstChild,
                              200},
                      Setting{"tree_b3_d2_greedy_k3",
                              0.0f,
                              0,
                              1.0f,
                              3,
                              DraftMethod::kModel,
                              {3, 2},
                              false,
                              false,
                              {1, 7, 3},
                              Broken::kFirstChild,
                              200},
                      // logit_bias: a banned token, others lifted and
                      // lowered; on a reduced draft head too, with biases
                      // on tokens it leaves out.
                      Biased("bias_temperature1_k3", 1.0f, 0, 3, false,
                             {{2, -100.0f}, {5, 1.5f}, {9, -1.0f}, {12, 2.0f}}),
                      Biased("bias_frspec_topk6_k2", 1.0f, 6, 2, true,
                             {{1, 2.0f}, {4, -100.0f}, {8, 1.0f}, {13, 3.0f}}),
                      Predicted("prediction_temperature1_k3", 1.0f, 0, 1.0f, 3, {7, 3, 5, 7, 3}),
                      Predicted("prediction_topk6_topp09_k2", 1.0f, 6, 0.9f, 2,
                                {7, 3, 5, 7, 3, 5})),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace specd
