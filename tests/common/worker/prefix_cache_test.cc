// Prefix caching in the worker runtime: two runtimes, caching on and off, driven in lockstep
// through random sessions of sequences that share prefixes (system prompts, resent history),
// with sampled and greedy drafts and verifications, truncations, releases and preemptions. Every
// answer must be bit for bit the same (memcmp on every probability and on whole kept rows): the
// cached KV is exactly the recomputed one. Only the work differs, and the metrics say by how much.
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/synth/synth.h"
#include "common/worker/worker_runtime.h"
#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/worker/worker_reference.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::SameBits;
using testing::Trunc;
using Tokens = std::vector<int32_t>;

class Counter : public RuntimeObserver {
 public:
  void OnForward(ForwardKind, int64_t, int64_t tokens, absl::Duration) override { fed += tokens; }
  void OnKvChanged(const KvPool&) override {}
  void OnPrefixCache(int64_t q, int64_t h) override {
    queried += q;
    hit += h;
  }
  int64_t fed = 0, queried = 0, hit = 0;
};

class PrefixCacheRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.max_position_embeddings = 512;
    spec.residual_scale = 0.7;
    spec.embed_std = 0.5;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::unique_ptr<WorkerRuntime> Runtime(bool caching, Counter* counter, int64_t kv_tokens) {
    EngineOptions options;
    options.kv_block_size = 8;
    options.kv_capacity_tokens = kv_tokens;
    options.prefix_caching = caching;
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(dir_->path(), 1, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    WorkerRuntimeOptions ro;
    ro.observer = counter;
    return std::make_unique<WorkerRuntime>(*std::move(engine), ro);
  }

  static inline testing::ScopedTempDir* dir_ = nullptr;
};

SamplingParams Params(int kind) {
  SamplingParams p;
  if (kind == 0) return p;  // greedy
  p.temperature = 0.8f;
  if (kind == 2) {
    p.top_k = 30;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.2f;
  }
  return p;
}

// Out of KV: in a small pool a copy on write can need one block more than recomputing, so one
// side may run out where the other does not; both then preempt the sequence.
bool Exhausted(const absl::Status& a, const absl::Status& b) {
  return absl::IsResourceExhausted(a) || absl::IsResourceExhausted(b);
}

void ExpectSameDraft(const SequenceOutcome& a, const SequenceOutcome& b,
                     const std::vector<DraftToken>& x, const std::vector<DraftToken>& y) {
  ASSERT_EQ(a.status, b.status);
  ASSERT_EQ(a.cached_len, b.cached_len);
  ASSERT_EQ(x.size(), y.size());
  for (size_t k = 0; k < x.size(); ++k) {
    ASSERT_EQ(x[k].token, y[k].token) << "sequence " << a.seq << " step " << k + 1;
    ASSERT_TRUE(SameBits(x[k].q_prob, y[k].q_prob)) << "sequence " << a.seq;
  }
}

void ExpectSameVerify(const VerifySequenceResult& a, const VerifySequenceResult& b) {
  ASSERT_EQ(a.status, b.status);
  ASSERT_EQ(a.cached_len, b.cached_len);
  ASSERT_EQ(a.position, b.position);
  ASSERT_TRUE(SameBits(a.p_draft, b.p_draft)) << "sequence " << a.seq;
  ASSERT_EQ(a.argmax, b.argmax);
  ASSERT_EQ(a.bonus_token, b.bonus_token);
  ASSERT_EQ(a.candidate_tokens, b.candidate_tokens);
  ASSERT_EQ(a.candidate_probs.size(), b.candidate_probs.size());
  for (size_t i = 0; i < a.candidate_probs.size(); ++i) {
    ASSERT_TRUE(SameBits(a.candidate_probs[i], b.candidate_probs[i]));
  }
}

TEST_F(PrefixCacheRuntimeTest, CachedAndUncachedWorkersAnswerBitForBit) {
  for (const int64_t kv_tokens : {int64_t{8192}, int64_t{320}}) {  // the small pool evicts
    SCOPED_TRACE(::testing::Message() << "kv_tokens " << kv_tokens);
    Counter on_count, off_count;
    auto on = Runtime(true, &on_count, kv_tokens);
    auto off = Runtime(false, &off_count, kv_tokens);
    std::mt19937 rng(11);
    auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<Tokens> systems;
    for (int i = 0; i < 2; ++i) {
      Tokens s = {1};
      for (int j = 0; j < 40 + 17 * i; ++j) s.push_back(3 + (j * 41 + i * 97) % 290);
      systems.push_back(s);
    }
    struct Seq {
      Tokens x;
      int64_t cached = 0;
      int kind = 0;
    };
    std::map<SeqId, Seq> live;
    std::vector<Tokens> finished;  // histories that later turns resend
    SeqId next = 1;
    int64_t exhausted = 0;
    // A sequence that ran out of KV in its first call was never created there.
    auto release = [&](SeqId seq) {
      for (WorkerRuntime* rt : {on.get(), off.get()}) {
        const absl::Status st = rt->Release(seq);
        ASSERT_TRUE(st.ok() || absl::IsNotFound(st)) << st;
      }
    };
    for (int round = 0; round < 80; ++round) {
      if (live.size() < 5 && rand(0, 1) == 0) {
        Seq s;
        if (!finished.empty() && rand(0, 1) == 0) {
          s.x = finished[static_cast<size_t>(rand(0, static_cast<int>(finished.size()) - 1))];
        } else {
          const Tokens& sys = systems[static_cast<size_t>(rand(0, 1))];
          s.x.assign(sys.begin(), sys.begin() + rand(1, static_cast<int>(sys.size())));
        }
        for (int j = rand(1, 12); j > 0; --j) s.x.push_back(rand(3, 299));
        s.kind = rand(0, 2);
        live[next++] = s;
      }
      std::vector<DraftSequenceRequest> drafts;
      std::vector<VerifySequenceRequest> verifies;
      for (auto& [id, s] : live) {
        if (s.x.size() > 300) continue;
        const Tokens catch_up(s.x.begin() + s.cached, s.x.end());
        if (rand(0, 1) == 0) {
          DraftSequenceRequest r;
          r.seq = id;
          r.catch_up = catch_up;
          r.expected_cached_len = s.cached;
          r.num_speculative_tokens = rand(1, 4);
          r.sampling = Params(s.kind);
          r.seed = id * 7;
          r.prompt_len = 5;
          drafts.push_back(r);
        } else {
          VerifySequenceRequest r;
          r.seq = id;
          r.catch_up = catch_up;
          r.expected_cached_len = s.cached;
          for (int k = rand(0, 3); k > 0; --k) r.drafts.push_back(rand(3, 299));
          r.num_candidates = s.kind == 0 ? 0 : 2;
          r.sampling = Params(s.kind);
          r.seed = id * 7;
          r.prompt_len = 5;
          verifies.push_back(r);
        }
      }
      std::map<SeqId, std::vector<DraftToken>> ta, tb;
      auto log = [](std::map<SeqId, std::vector<DraftToken>>* m) {
        return [m](const DraftStep& step) {
          for (const DraftToken& t : step.tokens) (*m)[t.seq].push_back(t);
        };
      };
      const std::vector<SequenceOutcome> da = on->Draft(drafts, log(&ta));
      const std::vector<SequenceOutcome> db = off->Draft(drafts, log(&tb));
      const std::vector<VerifySequenceResult> va = on->Verify(verifies);
      const std::vector<VerifySequenceResult> vb = off->Verify(verifies);
      ASSERT_EQ(da.size(), db.size());
      ASSERT_EQ(va.size(), vb.size());
      // Preempted (out of KV): released on both and replayed later from position 0.
      std::set<SeqId> preempted;
      for (size_t i = 0; i < da.size(); ++i) {
        if (Exhausted(da[i].status, db[i].status)) {
          preempted.insert(da[i].seq);
        } else {
          ExpectSameDraft(da[i], db[i], ta[da[i].seq], tb[da[i].seq]);
        }
      }
      for (size_t i = 0; i < va.size(); ++i) {
        if (Exhausted(va[i].status, vb[i].status)) {
          preempted.insert(va[i].seq);
        } else {
          ExpectSameVerify(va[i], vb[i]);
        }
      }
      for (const SeqId seq : preempted) {
        release(seq);
        live[seq].cached = 0;
      }
      exhausted += static_cast<int64_t>(preempted.size());

      // Commit: a verified sequence appends a random accepted prefix of its drafts and the
      // bonus; a drafted one a few of its drafts and a token of our own. Some rounds read a
      // whole kept row from both (memcmp) or ask q(y) at a rejection.
      for (const VerifySequenceResult& r : va) {
        if (preempted.contains(r.seq)) continue;
        ASSERT_TRUE(r.status.ok()) << r.status;
        Seq& s = live[r.seq];
        const VerifySequenceRequest& req =
            *std::find_if(verifies.begin(), verifies.end(),
                          [&](const VerifySequenceRequest& v) { return v.seq == r.seq; });
        const int n = rand(0, static_cast<int>(req.drafts.size()));
        if (rand(0, 3) == 0) {
          const int32_t step = rand(1, static_cast<int>(req.drafts.size()) + 1);
          const absl::StatusOr<ProbRow> ra = on->ReadRow(r.seq, step);
          const absl::StatusOr<ProbRow> rb = off->ReadRow(r.seq, step);
          ASSERT_TRUE(ra.ok() && rb.ok());
          ASSERT_EQ(ra->ids, rb->ids);
          ASSERT_TRUE(SameBits(ra->probs, rb->probs)) << "kept row " << step;
        }
        const int64_t keep = static_cast<int64_t>(s.x.size()) + n;
        s.x.insert(s.x.end(), req.drafts.begin(), req.drafts.begin() + n);
        s.x.push_back(r.bonus_token);
        const absl::StatusOr<TruncateResult> a = on->Truncate(Trunc(r.seq, keep));
        const absl::StatusOr<TruncateResult> b = off->Truncate(Trunc(r.seq, keep));
        ASSERT_TRUE(a.ok() && b.ok());
        ASSERT_EQ(a->cached_len, b->cached_len);
        s.cached = a->cached_len;
      }
      for (const SequenceOutcome& o : da) {
        if (preempted.contains(o.seq)) continue;
        ASSERT_TRUE(o.status.ok()) << o.status;
        Seq& s = live[o.seq];
        const std::vector<DraftToken>& t = ta[o.seq];
        const int n = rand(0, static_cast<int>(t.size()) - 1);
        const int64_t keep = static_cast<int64_t>(s.x.size()) + n;
        std::vector<int32_t> ys = {rand(3, 299), rand(3, 299)};
        const int32_t query = s.kind != 0 && rand(0, 1) == 0 ? n + 1 : 0;
        if (query == 0) ys.clear();
        const absl::StatusOr<TruncateResult> a = on->Truncate(Trunc(o.seq, keep, query, ys));
        const absl::StatusOr<TruncateResult> b = off->Truncate(Trunc(o.seq, keep, query, ys));
        ASSERT_TRUE(a.ok() && b.ok());
        ASSERT_TRUE(SameBits(a->q_probs, b->q_probs));
        for (int k = 0; k < n; ++k) s.x.push_back(t[static_cast<size_t>(k)].token);
        s.x.push_back(rand(3, 299));
        s.cached = a->cached_len;
      }
      // Some requests finish (their history is resent later), some resync after a failure.
      for (auto it = live.begin(); it != live.end();) {
        if (rand(0, 7) == 0 || it->second.x.size() > 300) {
          release(it->first);
          finished.push_back(it->second.x);
          it = live.erase(it);
          continue;
        }
        if (rand(0, 9) == 0 && it->second.cached > 0) {
          const int64_t keep = rand(0, static_cast<int>(it->second.cached));
          ASSERT_TRUE(on->Truncate(Trunc(it->first, keep)).ok());
          ASSERT_TRUE(off->Truncate(Trunc(it->first, keep)).ok());
          it->second.cached = keep;
        }
        ++it;
      }
    }
    for (const auto& [id, s] : live) release(id);
    EXPECT_EQ(on->engine().kv().used_blocks(), 0);
    EXPECT_EQ(off->engine().kv().used_blocks(), 0);
    EXPECT_EQ(on->engine().kv().free_blocks(), on->engine().kv().total_blocks());
    // The cache did work, and (where both ran the same calls) saved exactly the hits.
    EXPECT_GT(on_count.hit, 200);
    EXPECT_EQ(off_count.queried, 0);
    if (exhausted == 0) {
      EXPECT_EQ(on_count.fed + on_count.hit, off_count.fed);
    }
    if (kv_tokens < 1000) {
      EXPECT_GT(exhausted, 0) << "the small pool never ran out";
    }
  }
}

}  // namespace
}  // namespace specd
