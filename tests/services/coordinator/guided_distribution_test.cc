// Distribution exactness of speculative decoding under classifier-free guidance, end to end over
// in-process workers: on a synthetic pair with a 16-token vocabulary, the joint distribution of
// the first three generated tokens of a guided request matches the closed-form guided
// distribution of an independent numpy reference (guided_joint_reference.py: llama_ref on both
// texts, logits combined, then the processed distribution with penalties over the conditional
// text), with the draft unguided, with the draft guided, and with prompt lookup (n-gram) drafts
// (one-hot proposals judged by the multi-draft rule against the guided rows). Pearson's
// chi-square with fixed seeds and 20000 samples; exactness is rejected at p < 1e-4.
//
// Power: a deliberately broken guidance that mixes the probabilities instead of the logits,
// norm(max(0, p_u + s (p_c - p_u))), run through the same rounds (MixingProbabilitiesTarget), is
// rejected by the same test, and is itself consistent with the reference's closed form of that
// mistake (so the broken variant is the named bug and nothing else). For prompt lookup, rounds
// whose drafts are verified with the guidance lost (UnguidedDraftsTarget: the companion is fed
// but combined at scale 1, which is the conditional distribution) are rejected too.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/inverse_cdf.h"
#include "base/status_macros.h"
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

// The classic mistake, as a target worker for K = 0 rounds: the guided sequence and its companion
// are verified as two unguided sequences, their processed rows read back, and the next token drawn
// from norm(max(0, p_u + s (p_c - p_u))).
class MixingProbabilitiesTarget final : public testing::ForwardingWorker {
 public:
  explicit MixingProbabilitiesTarget(WorkerApi& inner) : ForwardingWorker(inner) {}
  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest>,
      const std::function<void(const DraftStep&)>&) override {
    return absl::UnimplementedError("a target");
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    std::vector<VerifySequenceRequest> split;
    for (const VerifySequenceRequest& r : batch) {
      if (!r.drafts.empty() || !r.companion.has_value()) {
        return absl::InvalidArgumentError("only guided K = 0 rounds");
      }
      VerifySequenceRequest c = r;
      c.companion.reset();
      VerifySequenceRequest u = c;
      u.seq = r.companion->seq;
      u.catch_up = r.companion->catch_up;
      u.expected_cached_len = r.companion->expected_cached_len;
      split.push_back(c);
      split.push_back(u);
    }
    SPECD_ASSIGN_OR_RETURN(std::vector<VerifySequenceResult> results, inner_.Verify(split));
    std::vector<RowQuery> rows;
    for (const VerifySequenceResult& r : results) {
      if (!r.status.ok()) return r.status;
      rows.push_back({r.seq, 1});
    }
    SPECD_ASSIGN_OR_RETURN(std::vector<SequenceAnswer<ProbRow>> kept, inner_.ReadRows(rows));
    std::vector<VerifySequenceResult> out;
    for (size_t i = 0; i < batch.size(); ++i) {
      SPECD_ASSIGN_OR_RETURN(const ProbRow pc_row, std::move(kept[2 * i].value));
      SPECD_ASSIGN_OR_RETURN(const ProbRow pu_row, std::move(kept[2 * i + 1].value));
      SPECD_ASSIGN_OR_RETURN(const std::vector<float> pc, DensifyRow(pc_row, kVocab, "p_c"));
      SPECD_ASSIGN_OR_RETURN(const std::vector<float> pu, DensifyRow(pu_row, kVocab, "p_u"));
      const double s = batch[i].companion->scale;
      std::vector<double> mixed(kVocab);
      for (int v = 0; v < kVocab; ++v) mixed[v] = std::max(0.0, pu[v] + s * (pc[v] - pu[v]));
      VerifySequenceResult r = results[2 * i];
      r.bonus_token = std::discrete_distribution<int32_t>(mixed.begin(), mixed.end())(rng_);
      r.argmax = {r.bonus_token};
      r.companion_cached_len = results[2 * i + 1].cached_len;
      out.push_back(std::move(r));
    }
    return out;
  }
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest>) override {
    return absl::UnimplementedError("K = 0 rounds truncate nothing");
  }

 private:
  std::mt19937_64 rng_{20231129};
};

// The bug that combining guidance with prompt lookup risks: the rounds that verify drafts lose
// the guidance. Their companion is still fed (so the worker's pair stays whole), but combined at
// scale 1, u + 1 (c - u) = c: those rows are the conditional distribution's.
class UnguidedDraftsTarget final : public testing::ForwardingWorker {
 public:
  explicit UnguidedDraftsTarget(WorkerApi& inner) : ForwardingWorker(inner) {}
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    std::vector<VerifySequenceRequest> changed(batch.begin(), batch.end());
    for (VerifySequenceRequest& r : changed) {
      if (!r.drafts.empty() && r.companion.has_value()) r.companion->scale = 1.0f;
    }
    return inner_.Verify(changed);
  }
};

// Prompt lookup needs a text that repeats itself: "7 3 5" twice, so the suffix "7 3" has an
// earlier occurrence to continue from.
const std::vector<int32_t> kRepeating = {1, 7, 3, 5, 7, 3, 5, 7, 3};

struct Setting {
  std::string name;
  float temperature;
  int32_t top_k;
  float top_p;
  float repetition_penalty;
  float scale;
  int32_t k;
  bool guide_draft;
  DraftMethod method = DraftMethod::kModel;
  std::vector<int32_t> prompt = {1, 7, 3};
};

// Prompt lookup on the repeating text, K = 3, for a guided target (scale 2) at temperature 1.
Setting GuidedNgram(std::string name) {
  Setting s{std::move(name), 1.0f, 0, 1.0f, 1.0f, 2.0f, 3, false};
  s.method = DraftMethod::kNgram;
  s.prompt = kRepeating;
  return s;
}

// Which target a run verifies with.
enum class Variant { kExact, kMixProbabilities, kUnguidedDrafts };

// What a run did: rounds that verified drafts, those of them that rejected one, and the drafts
// accepted.
struct Exercised {
  int64_t drafting = 0;
  int64_t rejecting = 0;
  int64_t accepted = 0;
};

class GuidedDistribution : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const SynthSpec spec = testing::ChiSquareTestSpec();
    ASSERT_EQ(spec.config.vocab_size, kVocab);
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  // The closed-form joint distribution of the first three tokens: guided (mix = "logits") or the
  // probability-mixing mistake (mix = "probs").
  static std::vector<double> Reference(const Setting& s, const std::string& mix) {
    return testing::RunF64Reference(
        "tests/services/coordinator/guided_joint_reference.py", dir_->path(),
        dir_->path() / (s.name + "_" + mix + ".f64"),
        absl::StrCat(s.temperature, " ", s.top_k, " ", s.top_p, " ", s.repetition_penalty, " ",
                     s.scale, " ", mix, " ", absl::StrJoin(kUncond, ","), " ",
                     absl::StrJoin(s.prompt, ",")),
        kVocab * kVocab * kVocab);
  }

  // Counts of the first three tokens over kSamples guided requests with different seeds.
  static std::vector<int64_t> Sample(const Setting& s, Variant variant, Exercised* seen) {
    auto target = MakeWorker(0);
    auto draft = MakeWorker(1);
    MixingProbabilitiesTarget mixing(*target);
    UnguidedDraftsTarget unguided_drafts(*target);
    WorkerApi& t = variant == Variant::kMixProbabilities ? static_cast<WorkerApi&>(mixing)
                   : variant == Variant::kUnguidedDrafts ? static_cast<WorkerApi&>(unguided_drafts)
                                                         : *target;
    const bool mix_probabilities = variant == Variant::kMixProbabilities;
    std::vector<int64_t> counts(kVocab * kVocab * kVocab, 0);
    constexpr int kBatch = 1000;
    for (int base = 0; base < kSamples; base += kBatch) {
      std::vector<SpeculativeSequence> seqs(kBatch);
      for (int i = 0; i < kBatch; ++i) {
        SpeculativeSequence& q = seqs[i];
        q.id = static_cast<uint64_t>(base + i + 1);
        q.tokens = s.prompt;
        q.prompt_len = static_cast<int64_t>(s.prompt.size());
        q.seed = 0x9d1ded00ULL + static_cast<uint64_t>(base + i);
        q.sampling.temperature = s.temperature;
        q.sampling.top_k = s.top_k;
        q.sampling.top_p = s.top_p;
        q.sampling.repetition_penalty = s.repetition_penalty;
        q.num_speculative_tokens = s.k;
        q.num_candidates = 2;
        q.draft_method = s.method;
        q.ngram = {1, 2};
        Guidance g;
        g.scale = s.scale;
        g.uncond_prompt = kUncond;
        g.draft = s.guide_draft;
        g.companion = q.id | (uint64_t{1} << 62);
        q.guidance = g;
      }
      while (true) {
        std::vector<SpeculativeSequence*> running;
        for (auto& q : seqs) {
          if (q.tokens.size() < s.prompt.size() + 3) running.push_back(&q);
        }
        if (running.empty()) break;
        for (const RoundStats& st : RunSpeculationRound(*draft, t, running, RoundOptions{32})) {
          EXPECT_TRUE(st.status.ok()) << st.status;
          seen->drafting += st.drafted > 0;
          seen->rejecting += st.accepted < st.drafted;
          seen->accepted += st.accepted;
        }
      }
      for (auto& q : seqs) {
        const size_t p = s.prompt.size();
        ++counts[static_cast<size_t>(q.tokens[p] * kVocab * kVocab + q.tokens[p + 1] * kVocab +
                                     q.tokens[p + 2])];
        EXPECT_TRUE(t.Release(q.id).ok());
        if (s.k > 0 && q.uses_draft_worker()) {
          EXPECT_TRUE(draft->Release(q.id).ok());
        }
        if (mix_probabilities) {
          EXPECT_TRUE(target->Release(q.guidance->companion).ok());
        }
      }
    }
    EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
    EXPECT_EQ(draft->runtime().engine().kv().used_blocks(), 0);
    return counts;
  }

  static std::unique_ptr<LocalWorker> MakeWorker(int64_t exit_layer) {
    auto engine = testing::MakeEngine(dir_->path(), 2, /*kv_tokens=*/32 * 1024, exit_layer);
    return std::make_unique<LocalWorker>(
        std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
  }

  static double PValue(const std::vector<int64_t>& counts, const std::vector<double>& joint) {
    std::vector<double> expected;
    for (const double pr : joint) expected.push_back(pr * kSamples);
    int64_t impossible = 0;
    for (size_t i = 0; i < joint.size(); ++i) impossible += joint[i] == 0.0 ? counts[i] : 0;
    EXPECT_EQ(impossible, 0) << "tokens with probability 0 were generated";
    return testing::PearsonChiSquare(counts, expected).p_value;
  }

  static inline ScopedTempDir* dir_ = nullptr;
  static inline const std::vector<int32_t> kUncond = {1, 12};
};

class GuidedDistributionTest : public GuidedDistribution,
                               public ::testing::WithParamInterface<Setting> {};

TEST_P(GuidedDistributionTest, FirstThreeTokensHaveTheGuidedJointDistribution) {
  const Setting& s = GetParam();
  Exercised seen;
  const double pv = PValue(Sample(s, Variant::kExact, &seen), Reference(s, "logits"));
  std::printf(
      "[%s] chi-square p-value %.4f (%lld rounds verified drafts, %lld ended in a "
      "rejection, %lld drafts accepted)\n",
      s.name.c_str(), pv, static_cast<long long>(seen.drafting),
      static_cast<long long>(seen.rejecting), static_cast<long long>(seen.accepted));
  if (s.k > 0) {
    EXPECT_GT(seen.rejecting, kSamples / 10) << "too few rejections to matter";
    EXPECT_GT(seen.accepted, kSamples / 10) << "too few accepted drafts to matter";
  }
  if (s.method == DraftMethod::kNgram) {
    EXPECT_GT(seen.drafting, kSamples / 2) << "prompt lookup hardly ever matched";
  }
  EXPECT_GT(pv, kAlpha);
}

INSTANTIATE_TEST_SUITE_P(
    Settings, GuidedDistributionTest,
    ::testing::Values(Setting{"unguided_draft_t1_s2_k2", 1.0f, 0, 1.0f, 1.0f, 2.0f, 2, false},
                      Setting{"guided_draft_t08_topk10_rep12_s3_k3", 0.8f, 10, 0.95f, 1.2f, 3.0f, 3,
                              true},
                      Setting{"no_speculation_t1_s2_k0", 1.0f, 0, 1.0f, 1.0f, 2.0f, 0, false},
                      GuidedNgram("ngram_t1_s2_k3")),
    [](const auto& info) { return info.param.name; });

TEST_F(GuidedDistribution, MixingProbabilitiesInsteadOfLogitsIsDetected) {
  const Setting s{"mixing_t1_s2_k0", 1.0f, 0, 1.0f, 1.0f, 2.0f, 0, false};
  Exercised unused;
  const std::vector<int64_t> counts = Sample(s, Variant::kMixProbabilities, &unused);
  const double against_guided = PValue(counts, Reference(s, "logits"));
  const double against_mixed = PValue(counts, Reference(s, "probs"));
  std::printf(
      "[%s] chi-square p-value %.3g against the guided distribution, %.4f against the "
      "closed form of mixing probabilities\n",
      s.name.c_str(), against_guided, against_mixed);
  EXPECT_LT(against_guided, kAlpha);
  EXPECT_GT(against_mixed, kAlpha);
}

TEST_F(GuidedDistribution, PromptLookupRoundsVerifiedUnguidedAreDetected) {
  const Setting s = GuidedNgram("ngram_unguided_drafts_t1_s2_k3");
  Exercised seen;
  const double pv = PValue(Sample(s, Variant::kUnguidedDrafts, &seen), Reference(s, "logits"));
  std::printf(
      "[%s] chi-square p-value %.3g against the guided distribution (%lld rounds verified "
      "drafts)\n",
      s.name.c_str(), pv, static_cast<long long>(seen.drafting));
  EXPECT_GT(seen.drafting, kSamples / 2);
  EXPECT_LT(pv, kAlpha);
}

}  // namespace
}  // namespace specd
