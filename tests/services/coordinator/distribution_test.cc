// Distribution exactness of speculative sampling, end to end over in-process workers: on a
// synthetic pair with a 16-token vocabulary, the joint distribution of the first three generated
// tokens matches the target's exact distribution, computed in closed form by an independent numpy
// reference (joint_reference.py). Pearson's chi-square with fixed seeds and 20000 samples;
// exactness is rejected at p < 1e-4. A deliberately broken residual (the correction drawn from p
// instead of norm(max(0, p - q))) must be rejected by the same test, which shows it has power.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "services/coordinator/speculation_round.h"
#include "tests/base/chi_square.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

constexpr int kVocab = 16;
constexpr int kSamples = 20000;
constexpr double kAlpha = 1e-4;

// Answers q(y) = 0 for every residual query, so the coordinator takes the first candidate y ~ p:
// the classic bug of sampling the correction from p.
class BrokenResidualDraft final : public WorkerApi {
 public:
  explicit BrokenResidualDraft(WorkerApi& inner) : inner_(inner) {}
  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    return inner_.Draft(batch, on_step);
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    return inner_.Verify(batch);
  }
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
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) override {
    return inner_.ReadRows(batch);
  }
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) override {
    return inner_.QueryLogprobs(batch);
  }
  absl::Status Release(SeqId seq) override { return inner_.Release(seq); }
  int64_t FreeKvTokens() const override { return inner_.FreeKvTokens(); }

 private:
  WorkerApi& inner_;
};

struct Setting {
  std::string name;
  float temperature;
  int32_t top_k;
  float top_p;
  int32_t k;
};

class DistributionTest : public ::testing::TestWithParam<Setting> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.vocab_size = kVocab;
    spec.config.num_layers = 3;
    spec.config.max_position_embeddings = 32;
    spec.config.bos_token_ids = {1};
    spec.config.eos_token_ids = {2};
    // Large enough that the 1-layer draft often disagrees, so rejections and residuals matter.
    spec.residual_scale = 0.8;
    spec.embed_std = 1.0;
    spec.seed = 5;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::vector<double> Reference(const Setting& s) {
    const std::filesystem::path out = dir_->path() / (s.name + ".f64");
    const std::string cmd = absl::StrCat(
        "/usr/bin/python3 ",
        (testing::SourceDir() / "tests/services/coordinator/joint_reference.py").string(), " ",
        dir_->path().string(), " ", out.string(), " ", s.temperature, " ", s.top_k, " ", s.top_p,
        " ", absl::StrJoin(kPrompt, " "));
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::vector<double> joint(kVocab * kVocab * kVocab);
    std::ifstream f(out, std::ios::binary);
    f.read(reinterpret_cast<char*>(joint.data()),
           static_cast<std::streamsize>(joint.size() * sizeof(double)));
    EXPECT_TRUE(f.good());
    return joint;
  }

  // Counts of the first three tokens over kSamples requests with different seeds.
  static std::vector<int64_t> Sample(const Setting& s, bool broken, int64_t* residual_rounds) {
    auto target = MakeWorker(0);
    auto draft = MakeWorker(1);
    BrokenResidualDraft broken_draft(*draft);
    WorkerApi& d = broken ? static_cast<WorkerApi&>(broken_draft) : *draft;
    std::vector<int64_t> counts(kVocab * kVocab * kVocab, 0);
    constexpr int kBatch = 1000;
    for (int base = 0; base < kSamples; base += kBatch) {
      std::vector<SpeculativeSequence> seqs(kBatch);
      for (int i = 0; i < kBatch; ++i) {
        SpeculativeSequence& q = seqs[i];
        q.id = static_cast<uint64_t>(base + i + 1);
        q.tokens = kPrompt;
        q.prompt_len = static_cast<int64_t>(kPrompt.size());
        q.seed = 0x5eed0000ULL + static_cast<uint64_t>(base + i);
        q.sampling.temperature = s.temperature;
        q.sampling.top_k = s.top_k;
        q.sampling.top_p = s.top_p;
        q.num_speculative_tokens = s.k;
        q.num_candidates = 2;
      }
      while (true) {
        std::vector<SpeculativeSequence*> running;
        for (auto& q : seqs) {
          if (q.tokens.size() < kPrompt.size() + 3) running.push_back(&q);
        }
        if (running.empty()) break;
        for (const RoundStats& st : RunSpeculationRound(d, *target, running, RoundOptions{32})) {
          EXPECT_TRUE(st.status.ok()) << st.status;
          *residual_rounds += st.accepted < st.drafted;
        }
      }
      for (auto& q : seqs) {
        const size_t p = kPrompt.size();
        ++counts[static_cast<size_t>(q.tokens[p] * kVocab * kVocab + q.tokens[p + 1] * kVocab +
                                     q.tokens[p + 2])];
        EXPECT_TRUE(target->Release(q.id).ok());
        EXPECT_TRUE(draft->Release(q.id).ok());
      }
    }
    EXPECT_EQ(target->runtime().engine().kv().used_blocks(), 0);
    return counts;
  }

  static std::unique_ptr<LocalWorker> MakeWorker(int64_t exit_layer) {
    auto engine = testing::MakeEngine(dir_->path(), 2, /*kv_tokens=*/16 * 1024, exit_layer);
    return std::make_unique<LocalWorker>(
        std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
  }

  static double PValue(const std::vector<int64_t>& counts, const std::vector<double>& joint) {
    std::vector<double> expected;
    for (const double pr : joint) expected.push_back(pr * kSamples);
    int64_t impossible = 0;
    for (size_t i = 0; i < joint.size(); ++i) impossible += joint[i] == 0.0 ? counts[i] : 0;
    EXPECT_EQ(impossible, 0) << "tokens with target probability 0 were generated";
    return testing::PearsonChiSquare(counts, expected).p_value;
  }

  static inline ScopedTempDir* dir_ = nullptr;
  static inline const std::vector<int32_t> kPrompt = {1, 7, 3};
};

TEST_P(DistributionTest, FirstThreeTokensHaveTheTargetsJointDistribution) {
  const Setting& s = GetParam();
  const std::vector<double> joint = Reference(s);
  int64_t residual_rounds = 0;
  const std::vector<int64_t> counts = Sample(s, /*broken=*/false, &residual_rounds);
  const double pv = PValue(counts, joint);
  std::printf("[%s] chi-square p-value %.4f (%lld rounds ended in a rejection)\n", s.name.c_str(),
              pv, static_cast<long long>(residual_rounds));
  EXPECT_GT(residual_rounds, kSamples / 10) << "too few rejections for a meaningful test";
  EXPECT_GT(pv, kAlpha);
}

TEST_P(DistributionTest, BrokenResidualIsDetected) {
  const Setting& s = GetParam();
  const std::vector<double> joint = Reference(s);
  int64_t residual_rounds = 0;
  const double pv = PValue(Sample(s, /*broken=*/true, &residual_rounds), joint);
  std::printf("[%s, broken residual] chi-square p-value %.3g\n", s.name.c_str(), pv);
  EXPECT_LT(pv, kAlpha);
}

INSTANTIATE_TEST_SUITE_P(Settings, DistributionTest,
                         ::testing::Values(Setting{"temperature1_k2", 1.0f, 0, 1.0f, 2},
                                           Setting{"topk6_topp09_k3", 1.0f, 6, 0.9f, 3},
                                           Setting{"temperature07_topp08_k1", 0.7f, 0, 0.8f, 1}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace specd
