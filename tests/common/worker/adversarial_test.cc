// A worker under malformed requests mixed into valid traffic, against a twin worker that gets only
// the valid traffic. The coordinator is the worker's only client, but a coordinator of another
// version, or one with a bug, must not be able to crash a worker, leak its KV blocks or change
// what its other sequences compute. So every malformed request must get a clear error (never OK,
// INTERNAL or UNKNOWN, always a message, reported once), and after every call the valid
// sequences' results, lengths, KV blocks and prefix-cache blocks must be exactly the twin's.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/worker/worker_runtime.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/worker/worker_model_suite.h"
#include "tests/common/worker/worker_reference.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::WorkerPrompt;
using Tokens = std::vector<int32_t>;

constexpr int32_t kVocab = testing::kWorkerTestVocab;
constexpr int64_t kBlock = 16;
constexpr int64_t kMaxSeqLen = 256;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Ids of sequences that only ever get malformed requests; the valid ones count up from 1.
constexpr SeqId kFirstMalformedId = 1'000'000;
// A guided sequence's companion id is its own plus this.
constexpr SeqId kCompanionIdOffset = 100'000;

// A malformed request must be refused with a status a person can act on.
void ExpectClearError(const absl::Status& st, const std::string& what) {
  EXPECT_FALSE(st.ok()) << what << " was accepted";
  EXPECT_NE(st.code(), absl::StatusCode::kInternal) << what << ": " << st;
  EXPECT_NE(st.code(), absl::StatusCode::kUnknown) << what << ": " << st;
  EXPECT_FALSE(st.message().empty()) << what;
}

// A valid sequence, as a coordinator tracks it.
struct Seq {
  Tokens x;            // committed tokens
  int64_t cached = 0;  // what both workers hold
  int64_t committed_before = 0;
  int64_t prompt_len = 0;
  bool created = false;  // the workers hold it once its first call succeeded
  // A guided sequence's companion: its id, unconditional prompt and cached length. Its text is
  // the unconditional prompt followed by the tokens generated so far.
  std::optional<SeqId> companion;
  Tokens uncond;
  int64_t companion_cached = 0;

  Tokens Catchup() const { return Tokens(x.begin() + cached, x.end()); }
  std::optional<CompanionRequest> Companion() const {
    if (!companion.has_value()) return std::nullopt;
    Tokens u = uncond;
    u.insert(u.end(), x.begin() + prompt_len, x.end());
    return CompanionRequest{*companion, 1.5f, Tokens(u.begin() + companion_cached, u.end()),
                            companion_cached};
  }
};

// One worker's view of a round: what each sequence got back.
struct RoundLog {
  std::map<SeqId, std::vector<DraftToken>> drafted;
  std::map<SeqId, int> failed_reports;
  std::map<SeqId, SequenceOutcome> draft_outcomes;
  std::map<SeqId, VerifySequenceResult> verify_results;
};

class WorkerAdversarialTest : public testing::WorkerModelSuite<::testing::TestWithParam<bool>> {
 protected:
  static std::unique_ptr<WorkerRuntime> Runtime(bool prefix_caching) {
    EngineOptions options;
    options.kv_block_size = kBlock;
    options.kv_capacity_tokens = 8192;
    options.max_seq_len = kMaxSeqLen;
    options.prefix_caching = prefix_caching;
    return std::make_unique<WorkerRuntime>(testing::MakeTestEngine(model_dir(), 1, options),
                                           WorkerRuntimeOptions());
  }
};

// Random requests, valid and malformed, drawn from one generator so that a failure reproduces.
class Traffic {
 public:
  explicit Traffic(uint32_t seed) : rng_(seed) {}

  int Rand(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool OneIn(int n) { return Rand(1, n) == 1; }

  SamplingParams Sampling() {
    if (OneIn(3)) return testing::EveryFilter();
    SamplingParams p;
    p.temperature = OneIn(2) ? 0.0f : 0.9f;
    return p;
  }

  // The fields every valid request of sequence `seq` shares.
  void FillValid(SequenceRequest& r, SeqId seq, const Seq& s) {
    r.seq = seq;
    r.catch_up = s.Catchup();
    r.expected_cached_len = s.cached;
    r.companion = s.Companion();
    r.sampling = Sampling();
    r.seed = seq * 7 + 1;
    r.prompt_len = s.prompt_len;
    if (OneIn(3)) r.logit_bias = {{3, 2.5f}, {17, -100.0f}, {250, 1.0f}};
    if (OneIn(3)) r.max_prefill_tokens = Rand(1, 20);
  }

  // One defect of those every per-sequence request can carry; `live` says whether r.seq names a
  // sequence the worker holds (with r.expected_cached_len its true length).
  void BreakSequenceRequest(SequenceRequest& r, bool live, std::string& what) {
    if (r.companion.has_value() && OneIn(3)) {
      if (OneIn(2)) {
        r.companion.reset();
        what = "a guided sequence without its companion";
      } else {
        // Past what it holds, or (without a drop) short of it.
        r.companion->expected_cached_len += r.drop_tail || OneIn(2) ? 1 : -1;
        what = "a wrong companion expected_cached_len";
      }
      return;
    }
    switch (Rand(0, 12)) {
      case 0:
        r.catch_up.push_back(OneIn(2) ? kVocab : -1);
        what = "a catch-up token outside the vocabulary";
        break;
      case 1:
        r.catch_up.clear();
        what = "no catch-up";
        break;
      case 2:
        r.sampling.top_p = OneIn(2) ? 1.5f : 0.0f;
        what = "top_p outside (0, 1]";
        break;
      case 3:
        r.sampling.temperature = OneIn(2) ? kNaN : -1.0f;
        what = "a NaN or negative temperature";
        break;
      case 4:
        r.sampling.repetition_penalty = OneIn(2) ? 0.0f : kNaN;
        what = "repetition_penalty not > 0";
        break;
      case 5:
        r.logit_bias = OneIn(2) ? std::vector<TokenBias>{{9, 1.0f}, {4, 1.0f}}
                                : std::vector<TokenBias>{{kVocab, 1.0f}};
        what = "logit_bias out of order or outside the vocabulary";
        break;
      case 6:
        r.logit_bias = {{5, kNaN}};
        what = "a NaN logit bias";
        break;
      case 7:
        r.max_prefill_tokens = -1;
        what = "a negative max_prefill_tokens";
        break;
      case 8:
        r.prompt_len = -3;
        what = "a negative prompt_len";
        break;
      case 9:
        if (live) {
          // Past what the worker holds, or (without a drop) short of it.
          r.expected_cached_len += r.drop_tail ? 2 : OneIn(2) ? 1 : -1;
          what = "a wrong expected_cached_len";
        } else {
          r.expected_cached_len = 5;
          what = "an unknown sequence";
        }
        break;
      case 10:
        r.catch_up = WorkerPrompt(static_cast<int>(kMaxSeqLen) + 8, 9);
        what = "a sequence over max_seq_len";
        break;
      case 11:
        r.companion = CompanionRequest{r.seq, 1.5f, {1, 2}, 0};
        what = "a companion with the sequence's own id";
        break;
      default:
        r.companion = CompanionRequest{r.seq + 500'000, kNaN, {1, 2}, 0};
        what = "a companion with a NaN scale";
        break;
    }
  }

  DraftSequenceRequest MalformedDraft(SequenceRequest base, bool live, std::string& what) {
    DraftSequenceRequest r;
    static_cast<SequenceRequest&>(r) = std::move(base);
    r.num_speculative_tokens = Rand(1, 4);
    // Half of them carry a defect any sequence request can have.
    switch (Rand(0, 5)) {
      case 0:
        r.num_speculative_tokens = OneIn(2) ? 0 : kMaxSpeculativeTokens + 1;
        what = "num_speculative_tokens outside [1, 64]";
        break;
      case 1:
        r.tree = OneIn(2) ? TreeShape{1, 1} : TreeShape{2, r.num_speculative_tokens + 1};
        what = "a tree of branching 1 or deeper than K";
        break;
      case 2:
        r.entropy_stop = EntropyStop{true, 0, 0.5f};
        if (OneIn(2)) r.entropy_stop = EntropyStop{true, 1, kNaN};
        what = "an entropy stop with min_tokens 0 or a NaN threshold";
        break;
      default:
        BreakSequenceRequest(r, live, what);
    }
    what = "Draft: " + what;
    return r;
  }

  VerifySequenceRequest MalformedVerify(SequenceRequest base, bool live, std::string& what) {
    VerifySequenceRequest r;
    static_cast<SequenceRequest&>(r) = std::move(base);
    r.drafts = {4, 5};
    switch (Rand(0, 9)) {
      case 0:
        r.drafts.push_back(OneIn(2) ? kVocab : -7);
        what = "a draft token outside the vocabulary";
        break;
      case 1:
        r.num_candidates = OneIn(2) ? -1 : kMaxCandidates + 1;
        what = "num_candidates outside [0, 64]";
        break;
      case 2:
        r.tree_parents = OneIn(2) ? std::vector<int32_t>{-1} : std::vector<int32_t>{1, -1};
        what = "tree_parents of the wrong size or with a later parent";
        break;
      case 3:
        r.logprobs = LogprobsRequest{LogprobsMode::kRaw, kMaxLogprobs + 1};
        what = "more top logprobs than 20";
        break;
      case 4:
        r.drafts = Tokens(kMaxSpeculativeTokens + 1, 3);
        what = "more drafts than 64";
        break;
      default:
        BreakSequenceRequest(r, live, what);
    }
    what = "Verify: " + what;
    return r;
  }

  TruncateSequenceRequest MalformedTruncate(SeqId seq, const Seq& s, std::string& what) {
    const int64_t cached = s.cached;
    TruncateSequenceRequest r = testing::Trunc(seq, cached);
    if (s.companion.has_value()) r.companion_new_len = s.companion_cached;
    switch (Rand(0, 4)) {
      case 0:
        r.new_len = -1;
        what = "Truncate: a negative length";
        break;
      case 1:
        r.query_step = kMaxSpeculativeTokens + 2;
        r.query_tokens = {1};
        what = "Truncate: a query step no call kept";
        break;
      case 2:
        r.query_step = 1;
        r.query_tokens = {kVocab};
        what = "Truncate: a query token outside the vocabulary";
        break;
      case 3:
        if (s.companion.has_value()) {
          r.companion_new_len.reset();
          what = "Truncate: a guided sequence without its companion's length";
        } else {
          r.companion_new_len = cached;
          what = "Truncate: a companion length for a sequence without one";
        }
        break;
      default:
        r.seq = seq + 2 * kFirstMalformedId;
        what = "Truncate: an unknown sequence";
    }
    return r;
  }

 private:
  std::mt19937 rng_;
};

// Runs one batch of drafts on a worker, logging what each sequence got.
void RunDrafts(WorkerRuntime& rt, const std::vector<DraftSequenceRequest>& batch, RoundLog& log) {
  const std::vector<SequenceOutcome> out = rt.Draft(batch, [&](const DraftStep& s) {
    for (const DraftToken& t : s.tokens) log.drafted[t.seq].push_back(t);
    for (const SequenceOutcome& f : s.failed) ++log.failed_reports[f.seq];
  });
  EXPECT_EQ(out.size(), batch.size());
  for (const SequenceOutcome& o : out) log.draft_outcomes[o.seq] = o;
}

void RunVerifies(WorkerRuntime& rt, const std::vector<VerifySequenceRequest>& batch,
                 RoundLog& log) {
  std::map<SeqId, int> reported;
  const std::vector<VerifySequenceResult> out =
      rt.Verify(batch, [&](const VerifySequenceResult& r) { ++reported[r.seq]; });
  EXPECT_EQ(out.size(), batch.size());
  for (VerifySequenceResult r : out) {
    EXPECT_EQ(reported[r.seq], 1) << "sequence " << r.seq << " reported " << reported[r.seq]
                                  << " times";
    r.forward_ns = 0;  // the clock, not the result
    log.verify_results[r.seq] = std::move(r);
  }
}

// Inserts `extra` at random places among `batch`, keeping the order of each.
template <typename T>
std::vector<T> Interleave(std::vector<T> batch, std::vector<T> extra, Traffic& traffic) {
  for (T& e : extra) {
    const int at = traffic.Rand(0, static_cast<int>(batch.size()));
    batch.insert(batch.begin() + at, std::move(e));
  }
  return batch;
}

TEST_P(WorkerAdversarialTest, MalformedRequestsHarmNoSequenceAndLeakNoBlock) {
  const bool prefix_caching = GetParam();
  std::unique_ptr<WorkerRuntime> rt = Runtime(prefix_caching);
  std::unique_ptr<WorkerRuntime> twin = Runtime(prefix_caching);
  // Seeds whose traffic caught a refused request that still dropped a tail (see worker_runtime.cc).
  Traffic traffic(prefix_caching ? 7 : 6);
  std::map<SeqId, Seq> live;
  SeqId next_valid = 1;
  SeqId next_malformed = kFirstMalformedId;
  int malformed = 0;
  size_t compared = 0;  // valid sequences' results checked against the twin's
  for (int round = 0; round < 120; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    if (live.size() < 5 && traffic.OneIn(2)) {
      const SeqId id = next_valid++;
      Seq& s = live[id];
      s.x = WorkerPrompt(traffic.Rand(1, 40), traffic.Rand(0, 99));
      s.prompt_len = static_cast<int64_t>(s.x.size());
      if (traffic.OneIn(3)) {
        s.companion = id + kCompanionIdOffset;
        s.uncond = WorkerPrompt(traffic.Rand(1, 10), 77);
      }
    }
    std::vector<DraftSequenceRequest> drafts;
    std::vector<VerifySequenceRequest> verifies;
    std::vector<SeqId> idle;  // live sequences that sit this round out
    for (auto& [id, s] : live) {
      s.committed_before = static_cast<int64_t>(s.x.size());
      if (s.created && traffic.OneIn(4)) {
        idle.push_back(id);
        continue;
      }
      if (traffic.OneIn(2)) {
        DraftSequenceRequest r;
        traffic.FillValid(r, id, s);
        r.num_speculative_tokens = traffic.Rand(1, 5);
        drafts.push_back(std::move(r));
      } else {
        VerifySequenceRequest r;
        traffic.FillValid(r, id, s);
        r.drafts = Tokens(static_cast<size_t>(traffic.Rand(0, 4)), traffic.Rand(0, kVocab - 1));
        r.num_candidates = traffic.Rand(0, 3);
        if (traffic.OneIn(3)) r.logprobs = LogprobsRequest{LogprobsMode::kRaw, 3};
        verifies.push_back(std::move(r));
      }
    }
    // Malformed requests, for new ids or for sequences that sit out (an id appears once a call).
    std::map<SeqId, std::string> what;
    std::vector<DraftSequenceRequest> bad_drafts;
    std::vector<VerifySequenceRequest> bad_verifies;
    std::set<SeqId> named;
    for (int i = traffic.Rand(0, 4); i > 0; --i) {
      SequenceRequest base;
      bool on_live = false;
      if (!idle.empty() && traffic.OneIn(2)) {
        const SeqId id =
            idle[static_cast<size_t>(traffic.Rand(0, static_cast<int>(idle.size()) - 1))];
        const Seq& s = live[id];
        if (s.companion.has_value() && traffic.OneIn(4)) {
          // The companion named as a sequence of its own.
          Seq as_own;
          as_own.x = WorkerPrompt(static_cast<int>(s.companion_cached) + 1, 5);
          as_own.cached = s.companion_cached;
          traffic.FillValid(base, *s.companion, as_own);
        } else if (s.cached >= 2 && traffic.OneIn(3)) {
          // A drop of the last cached token folded into the call: the defect must keep it too.
          Seq shorter = s;
          --shorter.cached;
          traffic.FillValid(base, id, shorter);
          base.drop_tail = true;
          on_live = true;
        } else {
          traffic.FillValid(base, id, s);
          on_live = true;
        }
      } else {
        Seq fresh;
        fresh.x = WorkerPrompt(traffic.Rand(1, 30), 3);
        fresh.prompt_len = 1;
        traffic.FillValid(base, next_malformed++, fresh);
      }
      if (!named.insert(base.seq).second) continue;  // one request per id
      std::string& w = what[base.seq];
      if (traffic.OneIn(2)) {
        bad_drafts.push_back(traffic.MalformedDraft(std::move(base), on_live, w));
      } else {
        bad_verifies.push_back(traffic.MalformedVerify(std::move(base), on_live, w));
      }
    }
    malformed += static_cast<int>(what.size());

    RoundLog got, want;
    RunDrafts(*rt, Interleave(drafts, bad_drafts, traffic), got);
    RunDrafts(*twin, drafts, want);
    RunVerifies(*rt, Interleave(verifies, bad_verifies, traffic), got);
    RunVerifies(*twin, verifies, want);
    for (const auto& [id, w] : what) {
      const bool drafted = got.draft_outcomes.contains(id);
      const absl::Status st =
          drafted ? got.draft_outcomes[id].status : got.verify_results[id].status;
      ExpectClearError(st, w);
      if (drafted) {
        EXPECT_EQ(got.failed_reports[id], 1) << w << ": reported as failed more than once";
        EXPECT_FALSE(got.drafted.contains(id)) << w << ": drafted tokens";
      }
    }
    for (const auto& [id, o] : want.draft_outcomes) {
      EXPECT_EQ(got.draft_outcomes[id], o) << "sequence " << id;
      ASSERT_EQ(got.drafted[id].size(), want.drafted[id].size()) << "sequence " << id;
      for (size_t k = 0; k < want.drafted[id].size(); ++k) {
        EXPECT_EQ(got.drafted[id][k].token, want.drafted[id][k].token) << "sequence " << id;
        EXPECT_TRUE(testing::SameBits(got.drafted[id][k].q_prob, want.drafted[id][k].q_prob));
      }
    }
    compared += want.draft_outcomes.size() + want.verify_results.size();
    for (const auto& [id, r] : want.verify_results) {
      EXPECT_EQ(got.verify_results[id], r)
          << "sequence " << id << ": " << got.verify_results[id].status;
    }

    // Advance the valid sequences as a coordinator would (random acceptance), on both workers.
    for (const auto& [id, o] : want.draft_outcomes) {
      ASSERT_TRUE(o.status.ok()) << "sequence " << id << ": " << o.status;
      live[id].cached = o.cached_len;
      live[id].companion_cached = o.companion_cached_len;
      live[id].created = true;
      if (!o.prefilling) live[id].x.push_back(traffic.Rand(0, kVocab - 1));
    }
    for (const auto& [id, r] : want.verify_results) {
      ASSERT_TRUE(r.status.ok()) << "sequence " << id << ": " << r.status;
      live[id].cached = r.cached_len;
      live[id].companion_cached = r.companion_cached_len;
      live[id].created = true;
      if (!r.prefilling) live[id].x.push_back(r.bonus_token);
    }
    for (auto it = live.begin(); it != live.end();) {
      Seq& s = it->second;
      const int64_t agreed = std::min(s.cached, s.committed_before);
      TruncateSequenceRequest keep;
      if (!s.companion.has_value()) {
        keep = testing::Trunc(it->first, traffic.Rand(0, static_cast<int>(agreed)));
      } else if (agreed < s.prompt_len) {
        // Still reading its prompt: nothing to take back.
        keep = testing::Trunc(it->first, agreed);
        keep.companion_new_len = s.companion_cached;
      } else {
        // A guided sequence is never cut into its prompt; its companion keeps the same
        // generated tokens after the unconditional prompt.
        keep = testing::Trunc(
            it->first, traffic.Rand(static_cast<int>(s.prompt_len), static_cast<int>(agreed)));
        keep.companion_new_len =
            static_cast<int64_t>(s.uncond.size()) + keep.new_len - s.prompt_len;
      }
      if (traffic.OneIn(3)) {
        std::string w;
        const absl::StatusOr<TruncateResult> bad =
            rt->Truncate(traffic.MalformedTruncate(it->first, s, w));
        ExpectClearError(bad.status(), w);
        ++malformed;
      }
      if (traffic.OneIn(3)) {
        const SeqId id = it->first;
        ExpectClearError(rt->ReadRow(id, traffic.OneIn(2) ? 0 : kMaxSpeculativeTokens + 2).status(),
                         "ReadRow of a step no call kept");
        const Tokens outside = {traffic.OneIn(2) ? -1 : kVocab};
        ExpectClearError(rt->QueryLogprobs(id, traffic.Rand(0, 1), outside).status(),
                         "QueryLogprobs of a token outside the vocabulary");
        malformed += 2;
      }
      const absl::StatusOr<TruncateResult> a = rt->Truncate(keep);
      const absl::StatusOr<TruncateResult> b = twin->Truncate(keep);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " / " << b.status();
      EXPECT_EQ(*a, *b);
      s.cached = b->cached_len;
      s.companion_cached = b->companion_cached_len;
      if (s.companion.has_value() && traffic.OneIn(4)) {
        ExpectClearError(rt->Release(*s.companion), "Release of a companion on its own");
        ++malformed;
      }
      if (s.x.size() > 150 || traffic.OneIn(10)) {
        ASSERT_TRUE(rt->Release(it->first).ok());
        ASSERT_TRUE(twin->Release(it->first).ok());
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    ExpectClearError(rt->Release(next_malformed + 3), "Release of an unknown sequence");
    ExpectClearError(rt->ReadRow(next_malformed + 3, 1).status(), "ReadRow of an unknown sequence");

    ASSERT_EQ(rt->num_sequences(), twin->num_sequences());
    for (const auto& [id, s] : live) {
      ASSERT_EQ(*rt->CachedLength(id), s.cached) << id;
      if (s.companion.has_value() && s.created) {
        ASSERT_EQ(*rt->CachedLength(*s.companion), s.companion_cached) << id;
      }
    }
    ASSERT_EQ(rt->engine().kv().used_blocks(), twin->engine().kv().used_blocks());
    ASSERT_EQ(rt->engine().kv().cached_blocks(), twin->engine().kv().cached_blocks());
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(malformed, 250) << "the traffic should carry many malformed requests";
  EXPECT_GT(compared, 200u) << "and many valid ones";
  EXPECT_EQ(rt->ReleaseAll(), static_cast<int64_t>(live.size()));
  EXPECT_EQ(rt->engine().kv().used_blocks(), 0);
  EXPECT_EQ(rt->num_sequences(), 0);
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, WorkerAdversarialTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("on") : std::string("off");
                         });

}  // namespace
}  // namespace specd
