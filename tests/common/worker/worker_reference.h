// An oracle for what a worker must return, written without WorkerRuntime: every row comes from
// one whole-sequence forward pass on a fresh sequence of its own engine, the processed
// distribution from LogitsProcessor, and every draw from StreamUniform + SampleInverseCdf in the
// order DESIGN.md ("One speculation round", "Randomness") prescribes. The CPU engine is batch
// invariant, so a correct worker matches this bit for bit.
#ifndef SPECD_TESTS_COMMON_WORKER_WORKER_REFERENCE_H_
#define SPECD_TESTS_COMMON_WORKER_WORKER_REFERENCE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "base/sampling_params.h"
#include "common/engine/llama_engine.h"
#include "common/protocol/worker_protocol.h"
#include "gtest/gtest.h"
#include "kernels/cpu/processed.h"

namespace specd::testing {

// Bitwise equality of two float arrays (EXPECT_EQ would call -0 and +0 equal).
inline bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The vocabulary of testing::WorkerTestSpec's model, which the worker tests share.
inline constexpr int32_t kWorkerTestVocab = 300;

// A prompt of `n` tokens of that vocabulary, a different one for each `salt`.
inline std::vector<int32_t> WorkerPrompt(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + salt * 101 + 5) % kWorkerTestVocab);
  return t;
}

// Temperature, top-k, top-p, min-p and every penalty at once.
inline SamplingParams EveryFilter() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.repetition_penalty = 1.2f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.2f;
  return p;
}

// A Truncate of an unguided sequence: keep `new_len` tokens, asking q (or p) of `query_tokens` in
// the kept row of `query_step` (0 asks nothing).
inline TruncateSequenceRequest Trunc(SeqId seq, int64_t new_len, int32_t query_step = 0,
                                     std::vector<int32_t> query_tokens = {}) {
  TruncateSequenceRequest r;
  r.seq = seq;
  r.new_len = new_len;
  r.query_step = query_step;
  r.query_tokens = std::move(query_tokens);
  return r;
}

class RowOracle {
 public:
  explicit RowOracle(std::unique_ptr<LlamaEngine> engine) : engine_(std::move(engine)) {}

  int64_t vocab() const { return engine_->config().vocab_size; }

  // Next-token logits after tokens[0..p] for every p in [first, tokens.size()), from one forward
  // call over the whole of `tokens` on a fresh sequence: [tokens.size() - first][vocab].
  std::vector<std::vector<float>> Logits(const std::vector<int32_t>& tokens, size_t first) {
    const SeqId seq = next_seq_++;
    EXPECT_TRUE(engine_->AddSequence(seq).ok());
    SequenceInput in;
    in.seq = seq;
    in.tokens = tokens;
    for (size_t p = first; p < tokens.size(); ++p)
      in.logit_indices.push_back(static_cast<int32_t>(p));
    absl::StatusOr<specd::Logits> out = engine_->Forward(std::span<const SequenceInput>(&in, 1));
    EXPECT_TRUE(out.ok()) << out.status();
    absl::StatusOr<std::vector<float>> all =
        out.ok() ? engine_->ReadLogits(*out) : absl::StatusOr<std::vector<float>>(out.status());
    EXPECT_TRUE(all.ok()) << all.status();
    std::vector<std::vector<float>> rows;
    const size_t v = static_cast<size_t>(vocab());
    for (size_t r = 0; all.ok() && r < in.logit_indices.size(); ++r) {
      rows.emplace_back(all->begin() + r * v, all->begin() + (r + 1) * v);
    }
    EXPECT_TRUE(engine_->Release(seq).ok());
    return rows;
  }

  // The processed row for the token after `context` (prompt = its first prompt_len tokens; the
  // rest counts as output). Temperature 0 gives the greedy point mass.
  std::vector<float> Row(std::span<const float> logits, const std::vector<int32_t>& context,
                         int64_t prompt_len, const SamplingParams& params) {
    const size_t prompt = std::min(context.size(), static_cast<size_t>(prompt_len));
    const kernels::cpu::TokenHistory history{std::span<const int32_t>(context).subspan(0, prompt),
                                             std::span<const int32_t>(context).subspan(prompt)};
    std::vector<float> row(static_cast<size_t>(vocab()), 0.0f);
    if (params.greedy()) {
      absl::StatusOr<int32_t> t = processor_.GreedyToken(logits, params, history);
      EXPECT_TRUE(t.ok()) << t.status();
      row[static_cast<size_t>(t.ok() ? *t : 0)] = 1.0f;
    } else {
      const absl::Status st = processor_.ProcessedDistribution(logits, params, history, row);
      EXPECT_TRUE(st.ok()) << st;
    }
    return row;
  }

  int32_t Greedy(std::span<const float> logits, const std::vector<int32_t>& context,
                 int64_t prompt_len, const SamplingParams& params) {
    const size_t prompt = std::min(context.size(), static_cast<size_t>(prompt_len));
    const kernels::cpu::TokenHistory history{std::span<const int32_t>(context).subspan(0, prompt),
                                             std::span<const int32_t>(context).subspan(prompt)};
    absl::StatusOr<int32_t> t = processor_.GreedyToken(logits, params, history);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : -1;
  }

 private:
  std::unique_ptr<LlamaEngine> engine_;
  kernels::cpu::LogitsProcessor processor_;
  SeqId next_seq_ = 1'000'000;
};

inline int32_t Draw(std::span<const float> row, uint64_t seed, size_t position, Purpose purpose,
                    uint32_t index = 0) {
  absl::StatusOr<int32_t> t =
      SampleInverseCdf(row, StreamUniform(seed, static_cast<uint32_t>(position), purpose, index));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : -1;
}

struct ExpectedDraft {
  std::vector<int32_t> tokens;           // t_1..t_K
  std::vector<float> q;                  // q_k(t_k)
  std::vector<std::vector<float>> rows;  // q_1..q_K
};

// Drafts K tokens after committed tokens `x` autoregressively. `greedy_mode` is
// DRAFT_SAMPLING_GREEDY: take the argmax of the processed row and report a point mass.
inline ExpectedDraft ReferenceDraft(RowOracle& oracle, const std::vector<int32_t>& x,
                                    int64_t prompt_len, const SamplingParams& params, uint64_t seed,
                                    int32_t K, bool greedy_mode = false) {
  ExpectedDraft d;
  std::vector<int32_t> context = x;
  for (int32_t k = 1; k <= K; ++k) {
    const std::vector<float> logits = oracle.Logits(context, context.size() - 1).at(0);
    std::vector<float> row = oracle.Row(logits, context, prompt_len, params);
    int32_t t;
    if (params.greedy() || greedy_mode) {
      t = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      std::fill(row.begin(), row.end(), 0.0f);
      row[static_cast<size_t>(t)] = 1.0f;
    } else {
      t = Draw(row, seed, context.size(), Purpose::kDraftSample);
    }
    d.tokens.push_back(t);
    d.q.push_back(row[static_cast<size_t>(t)]);
    d.rows.push_back(std::move(row));
    context.push_back(t);
  }
  return d;
}

struct ExpectedVerify {
  int32_t position = 0;
  std::vector<float> p_draft;
  std::vector<int32_t> argmax;
  int32_t bonus = 0;
  std::vector<std::vector<int32_t>> candidates;  // empty when greedy
  std::vector<std::vector<float>> candidate_p;
  std::vector<std::vector<float>> rows;  // p_1..p_{K+1}
};

inline ExpectedVerify ReferenceVerify(RowOracle& oracle, const std::vector<int32_t>& x,
                                      int64_t prompt_len, const std::vector<int32_t>& drafts,
                                      const SamplingParams& params, uint64_t seed, int32_t M) {
  ExpectedVerify v;
  const size_t K = drafts.size();
  std::vector<int32_t> all = x;
  all.insert(all.end(), drafts.begin(), drafts.end());
  const std::vector<std::vector<float>> logits = oracle.Logits(all, x.size() - 1);
  v.position = static_cast<int32_t>(x.size());
  for (size_t i = 0; i <= K; ++i) {
    const std::vector<int32_t> context(all.begin(), all.begin() + static_cast<long>(x.size() + i));
    v.rows.push_back(oracle.Row(logits[i], context, prompt_len, params));
    v.argmax.push_back(oracle.Greedy(logits[i], context, prompt_len, params));
    if (i < K) v.p_draft.push_back(v.rows[i][static_cast<size_t>(drafts[i])]);
  }
  if (params.greedy()) {
    v.bonus = v.argmax[K];
    return v;
  }
  v.bonus = Draw(v.rows[K], seed, x.size() + K, K > 0 ? Purpose::kBonus : Purpose::kTargetSample);
  for (size_t i = 0; i < K; ++i) {
    v.candidates.emplace_back();
    v.candidate_p.emplace_back();
    for (int32_t m = 0; m < M; ++m) {
      const int32_t y =
          Draw(v.rows[i], seed, x.size() + i, Purpose::kCandidate, static_cast<uint32_t>(m));
      v.candidates.back().push_back(y);
      v.candidate_p.back().push_back(v.rows[i][static_cast<size_t>(y)]);
    }
  }
  return v;
}

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_WORKER_WORKER_REFERENCE_H_
