#include "common/engine/backend_self_check.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/absl_string.h"
#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "base/sampling_params.h"
#include "base/status_macros.h"
#include "common/model/weights.h"
#include "common/sampling/logprob_rows.h"
#include "common/sampling/row_pool.h"
#include "common/sampling/row_sampler.h"
#include "common/synth/synth.h"

namespace specd {
namespace {

constexpr int64_t kPromptLen = 20;
constexpr int64_t kDecodeSteps = 12;
constexpr int64_t kMaxSeqLen = 64;  // the longest sequence the check feeds is 32 tokens
// The largest max|a - b| / max|b| of a logit row against the CPU's: both back ends read the same
// weights and accumulate in f32, so only the order of the sums differs (~1e-6), and a KV cache in
// 16 bits may round a value the other way. A broken kernel is off by far more.
constexpr double kLogitToleranceF32Kv = 1e-3;
constexpr double kLogitTolerance16BitKv = 1e-2;
// The largest difference of a processed probability, or of a logprob, from the CPU's, on the
// same logits.
constexpr double kProbTolerance = 1e-5;
constexpr double kLogprobTolerance = 1e-4;
// Logit rows of the sampling check: two of each RowCase, each with its top logprobs.
constexpr int64_t kSampledRows = 8;
constexpr int32_t kTopLogprobs = 5;

// A directory of its own under the system's temporary directory, removed on destruction.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create() {
    std::error_code ec;
    const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("no temporary directory for its model: ", ec.message()));
    }
    std::string path = (base / "specd-self-check-XXXXXX").string();
    if (mkdtemp(path.data()) == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "cannot create ", path, " for its model: ", std::generic_category().message(errno)));
    }
    return TempDir(std::move(path));
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit TempDir(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// Deterministic token ids in [3, vocab), away from the special tokens.
std::vector<int32_t> Tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> out;
  uint32_t x = seed;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<int32_t>(3 + (x >> 8) % static_cast<uint32_t>(vocab - 3)));
  }
  return out;
}

std::vector<int32_t> AllRows(int64_t n) {
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return rows;
}

int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// One forward pass, its logit rows copied to the host.
absl::StatusOr<std::vector<float>> Run(LlamaEngine& engine, std::span<const SequenceInput> batch) {
  SPECD_ASSIGN_OR_RETURN(const Logits logits, engine.Forward(batch));
  return engine.ReadLogits(logits);
}

// `tokens` fed to `seq` from `start`, with the logits of every fed token.
absl::StatusOr<std::vector<float>> Feed(LlamaEngine& engine, KvPool::SeqId seq,
                                        std::span<const int32_t> tokens, int64_t start) {
  SequenceInput in;
  in.seq = seq;
  in.tokens = tokens;
  in.start_pos = start;
  in.logit_indices = AllRows(static_cast<int64_t>(tokens.size()));
  return Run(engine, std::span<const SequenceInput>(&in, 1));
}

// The first row at which `got` and `want` (rows of `vocab`) differ in any bit, or -1.
int64_t FirstDifferingRow(std::span<const float> got, std::span<const float> want, int64_t vocab) {
  for (size_t r = 0; r * vocab < want.size(); ++r) {
    if (std::memcmp(got.data() + r * vocab, want.data() + r * vocab, vocab * sizeof(float)) != 0) {
      return static_cast<int64_t>(r);
    }
  }
  return -1;
}

absl::Status RequireSameBits(std::span<const float> got, std::span<const float> want, int64_t vocab,
                             std::string_view what) {
  if (got.size() != want.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ToAbsl(what), ": ", got.size(), " logits where ", want.size(), " were expected"));
  }
  const int64_t row = FirstDifferingRow(got, want, vocab);
  if (row < 0) return absl::OkStatus();
  double diff = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    diff = std::max(diff, std::abs(static_cast<double>(got[row * vocab + v]) -
                                   static_cast<double>(want[row * vocab + v])));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: logit row %d differs (by up to %g), but a sequence's logits must not depend on how its "
      "tokens are chunked, batched or replayed, or speculative output would not equal plain "
      "decoding",
      what, row, diff));
}

// Each row of `got` against the CPU's `want`: within `tolerance` relative to the row's largest
// magnitude, and where the argmax differs, the two tokens' CPU logits within that tolerance too
// (a near-tie, which any summation order may break either way).
absl::Status RequireNearCpu(std::span<const float> got, std::span<const float> want, int64_t vocab,
                            double tolerance, std::string_view what) {
  for (size_t r = 0; r * vocab < want.size(); ++r) {
    const std::span<const float> g = got.subspan(r * vocab, vocab);
    const std::span<const float> w = want.subspan(r * vocab, vocab);
    double scale = 0;
    double diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      scale = std::max(scale, std::abs(static_cast<double>(w[v])));
      diff = std::max(diff, std::abs(static_cast<double>(g[v]) - static_cast<double>(w[v])));
    }
    const bool finite = std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); });
    if (!finite || diff > tolerance * scale) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: logit row %d is %s the CPU's (max|a - b| / max|b| = %g, tolerance %g)", what, r,
          finite ? "far from" : "not finite, unlike", finite ? diff / scale : 0.0, tolerance));
    }
    const int32_t ga = Argmax(g);
    const int32_t wa = Argmax(w);
    if (ga != wa && w[wa] - w[ga] > tolerance * scale) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: row %d picks token %d where the CPU picks %d, whose logit is larger by %g", what, r,
          ga, wa, w[wa] - w[ga]));
    }
  }
  return absl::OkStatus();
}

struct Engines {
  std::unique_ptr<LlamaEngine> checked;
  std::unique_ptr<LlamaEngine> cpu;
};

// Greedy decoding of kDecodeSteps tokens after the prompt, one token per pass: sequence 1 alone,
// and sequences 2 and 3 together. Returns the tokens (the prompt's argmax first) and checks that
// both ways give the same bits; the engine records each decode shape the second time it sees it,
// so most steps are replays.
absl::StatusOr<std::vector<int32_t>> DecodeBothWays(LlamaEngine& engine,
                                                    std::span<const float> prompt_logits,
                                                    std::vector<float>& rows) {
  const int64_t vocab = engine.logits_width();
  std::vector<int32_t> tokens = {Argmax(prompt_logits.subspan((kPromptLen - 1) * vocab, vocab))};
  for (int64_t step = 0; step < kDecodeSteps; ++step) {
    const std::span<const int32_t> next(&tokens.back(), 1);
    const int64_t pos = kPromptLen + step;
    SPECD_ASSIGN_OR_RETURN(std::vector<float> alone, Feed(engine, 1, next, pos));
    SequenceInput pair[2];
    for (int i = 0; i < 2; ++i) {
      pair[i].seq = 2 + i;
      pair[i].tokens = next;
      pair[i].start_pos = pos;
      pair[i].logit_indices = {0};
    }
    SPECD_ASSIGN_OR_RETURN(const std::vector<float> together, Run(engine, pair));
    SPECD_RETURN_IF_ERROR(
        RequireSameBits(std::span<const float>(together).first(vocab), alone, vocab,
                        absl::StrCat("decode step ", step, " alone and in a batch of two")));
    rows.insert(rows.end(), alone.begin(), alone.end());
    tokens.push_back(Argmax(alone));
  }
  tokens.pop_back();  // fed from here on: the prompt's argmax and kDecodeSteps - 1 decoded tokens
  return tokens;
}

// The per-token ops on one engine's back end over host `logits`: rows processed with several
// sampling settings (greedy, plain, every filter and penalty, classifier-free guidance), draws
// from the sampled rows, and every row's raw logprobs.
struct SamplingResult {
  std::vector<int32_t> argmax;
  std::vector<int32_t> row_error;
  std::vector<std::vector<float>> probs;  // the processed rows of kSample rows
  std::vector<kernels::Draw> draws;
  std::vector<int32_t> tokens, draw_error;
  std::vector<float> token_probs;
  // Raw logprobs of every processed row: its top kTopLogprobs, and token 3's.
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs, queried;
};

struct RowCase {
  SamplingParams params;
  kernels::RowMode mode;
};

std::vector<RowCase> RowCases() {
  SamplingParams plain;
  SamplingParams penalised;
  penalised.temperature = 0.7f;
  penalised.top_k = 40;
  penalised.top_p = 0.9f;
  penalised.min_p = 0.02f;
  penalised.repetition_penalty = 1.3f;
  penalised.presence_penalty = 0.4f;
  penalised.frequency_penalty = 0.2f;
  SamplingParams greedy = penalised;
  greedy.temperature = 0.0f;
  return {{plain, kernels::RowMode::kSample},
          {penalised, kernels::RowMode::kSample},
          {greedy, kernels::RowMode::kGreedy},
          {penalised, kernels::RowMode::kArgmaxOfProcessed}};
}

// `logits` holds kSampledRows rows to process, then the unconditional companion of row 0, which
// classifier-free guidance combines into it first.
absl::StatusOr<SamplingResult> Sample(LlamaEngine& engine, std::span<const float> logits,
                                      std::span<const int32_t> prompt,
                                      std::span<const int32_t> output) {
  kernels::Backend& backend = engine.backend();
  const int64_t vocab = engine.logits_width();
  const int64_t rows = kSampledRows;
  const int64_t bytes = static_cast<int64_t>(logits.size() * sizeof(float));
  SPECD_ASSIGN_OR_RETURN(kernels::Buffer device,
                         backend.Allocate(bytes, kernels::MemoryKind::kScratch, "self-check rows"));
  SPECD_RETURN_IF_ERROR(backend.Upload(device.data(), logits.data(), bytes));
  SPECD_RETURN_IF_ERROR(backend.Synchronize());

  RowPool pool(backend, vocab);
  SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> slots, pool.Acquire(rows));
  RowSampler sampler(backend);
  sampler.Clear();
  const std::vector<RowCase> cases = RowCases();
  SamplingResult result;
  for (int64_t r = 0; r < rows; ++r) {
    const RowCase& c = cases[static_cast<size_t>(r) % cases.size()];
    sampler.AddRow(c.params, c.mode, prompt, output, slots[static_cast<size_t>(r)]);
    if (c.mode != kernels::RowMode::kSample) continue;
    for (uint32_t i = 0; i < 4; ++i) {
      kernels::Draw d;
      d.prob_slot = slots[static_cast<size_t>(r)];
      d.position = static_cast<uint32_t>(kPromptLen + r);
      d.purpose = Purpose::kTargetSample;
      d.index = i;
      d.seed = 0x5e1fc4ec0000ull + static_cast<uint64_t>(r);
      sampler.AddDraw(d);
      result.draws.push_back(d);
    }
  }
  sampler.AddGuidance(0, static_cast<int32_t>(rows), 1.5f);
  sampler.KeepPenalized();
  SPECD_RETURN_IF_ERROR(sampler.Run(device.as<float>(), rows + 1, pool));
  for (int64_t r = 0; r < rows; ++r) {
    result.argmax.push_back(sampler.argmax(static_cast<int32_t>(r)));
    result.row_error.push_back(sampler.row_error(static_cast<int32_t>(r)));
    std::vector<float> row;
    if (cases[static_cast<size_t>(r) % cases.size()].mode == kernels::RowMode::kSample) {
      SPECD_ASSIGN_OR_RETURN(row, pool.ReadRow(slots[static_cast<size_t>(r)]));
    }
    result.probs.push_back(std::move(row));
  }
  for (size_t i = 0; i < result.draws.size(); ++i) {
    result.tokens.push_back(sampler.token(static_cast<int32_t>(i)));
    result.token_probs.push_back(sampler.token_prob(static_cast<int32_t>(i)));
    result.draw_error.push_back(sampler.draw_error(static_cast<int32_t>(i)));
  }
  LogprobRows logprobs(backend);
  logprobs.Clear();
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t row =
        logprobs.AddRow({sampler.penalized(static_cast<int32_t>(r)), -1}, kTopLogprobs, -1);
    logprobs.AddQuery(row, 3);
  }
  SPECD_RETURN_IF_ERROR(logprobs.Run(pool));
  for (int32_t r = 0; r < rows; ++r) {
    const std::span<const int32_t> ids = logprobs.top_ids(r);
    const std::span<const float> values = logprobs.top_logprobs(r);
    result.top_ids.insert(result.top_ids.end(), ids.begin(), ids.end());
    result.top_logprobs.insert(result.top_logprobs.end(), values.begin(), values.end());
    result.queried.push_back(logprobs.query(r));
  }
  pool.Release(slots);
  return result;
}

absl::Status CheckSampling(Engines& e, std::span<const float> cpu_logits,
                           std::span<const int32_t> prompt, std::span<const int32_t> output) {
  SPECD_ASSIGN_OR_RETURN(const SamplingResult got, Sample(*e.checked, cpu_logits, prompt, output));
  SPECD_ASSIGN_OR_RETURN(const SamplingResult want, Sample(*e.cpu, cpu_logits, prompt, output));
  for (size_t r = 0; r < want.argmax.size(); ++r) {
    if (got.row_error[r] != kernels::kRowOk) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "processing row %d reported error %d on a finite row", r, got.row_error[r]));
    }
    if (got.argmax[r] != want.argmax[r]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "row %d's argmax is token %d where the CPU's is %d", r, got.argmax[r], want.argmax[r]));
    }
    for (size_t v = 0; v < want.probs[r].size(); ++v) {
      const double diff = std::abs(static_cast<double>(got.probs[r][v]) - want.probs[r][v]);
      if (!(diff <= kProbTolerance)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "processed row %d gives token %d probability %g where the CPU gives %g (tolerance %g)",
            r, v, got.probs[r][v], want.probs[r][v], kProbTolerance));
      }
    }
  }
  for (size_t i = 0; i < want.top_ids.size(); ++i) {
    if (got.top_ids[i] != want.top_ids[i] ||
        !(std::abs(got.top_logprobs[i] - want.top_logprobs[i]) <= kLogprobTolerance)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "row %d's top logprob %d is token %d at %g where the CPU's is token %d at %g "
          "(tolerance %g)",
          i / kTopLogprobs, i % kTopLogprobs, got.top_ids[i], got.top_logprobs[i], want.top_ids[i],
          want.top_logprobs[i], kLogprobTolerance));
    }
  }
  for (size_t r = 0; r < want.queried.size(); ++r) {
    if (!(std::abs(got.queried[r] - want.queried[r]) <= kLogprobTolerance)) {
      return absl::FailedPreconditionError(
          absl::StrFormat("row %d gives token 3 logprob %g where the CPU gives %g (tolerance %g)",
                          r, got.queried[r], want.queried[r], kLogprobTolerance));
    }
  }
  for (size_t i = 0; i < got.draws.size(); ++i) {
    const kernels::Draw& d = got.draws[i];
    const size_t r = static_cast<size_t>(d.position - kPromptLen);
    const std::vector<float>& row = got.probs[r];
    const double u = StreamUniform(d.seed, d.position, d.purpose, d.index, d.sample);
    SPECD_ASSIGN_OR_RETURN(const int32_t want_token, SampleInverseCdf(row, u));
    if (got.draw_error[i] != kernels::kRowOk || got.tokens[i] != want_token ||
        got.token_probs[i] != row[static_cast<size_t>(want_token)]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "draw %d from row %d gave token %d (probability %g, error %d); the inverse CDF of the "
          "same row at u = %.17g is token %d (probability %g)",
          i, r, got.tokens[i], got.token_probs[i], got.draw_error[i], u, want_token,
          row[static_cast<size_t>(want_token)]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Engines> MakeEngines(const BackendFactory& make, const std::filesystem::path& dir,
                                    const EngineOptions& options) {
  Engines e;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> checked, make());
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModelWeights(dir));
  SPECD_ASSIGN_OR_RETURN(e.checked,
                         LlamaEngine::Create(std::move(weights), std::move(checked), options));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> cpu, kernels::CreateCpuBackend(2));
  SPECD_ASSIGN_OR_RETURN(weights, LoadModelWeights(dir));
  SPECD_ASSIGN_OR_RETURN(e.cpu, LlamaEngine::Create(std::move(weights), std::move(cpu), options));
  return e;
}

absl::Status RunChecks(Engines& e, double tolerance) {
  LlamaEngine& engine = *e.checked;
  const int64_t vocab = engine.logits_width();
  const std::vector<int32_t> prompt = Tokens(kPromptLen, vocab, 11);
  const std::vector<int32_t> other = Tokens(13, vocab, 23);
  for (KvPool::SeqId seq = 1; seq <= 8; ++seq) SPECD_RETURN_IF_ERROR(engine.AddSequence(seq));
  SPECD_RETURN_IF_ERROR(e.cpu->AddSequence(1));

  // The prompt in one pass, in chunks of 7, 1 and 12, and beside another sequence.
  SPECD_ASSIGN_OR_RETURN(const std::vector<float> whole, Feed(engine, 1, prompt, 0));
  std::vector<float> chunked;
  int64_t start = 0;
  for (const int64_t len : {7, 1, 12}) {
    SPECD_ASSIGN_OR_RETURN(
        const std::vector<float> part,
        Feed(engine, 2, std::span<const int32_t>(prompt).subspan(start, len), start));
    chunked.insert(chunked.end(), part.begin(), part.end());
    start += len;
  }
  SPECD_RETURN_IF_ERROR(RequireSameBits(chunked, whole, vocab,
                                        "a 20-token prompt in one pass and in chunks of 7, 1, 12"));
  SequenceInput pair[2];
  pair[0].seq = 3;
  pair[0].tokens = prompt;
  pair[0].logit_indices = AllRows(kPromptLen);
  pair[1].seq = 4;
  pair[1].tokens = other;
  pair[1].logit_indices = {static_cast<int32_t>(other.size()) - 1};
  SPECD_ASSIGN_OR_RETURN(std::vector<float> batched, Run(engine, pair));
  batched.resize(whole.size());
  SPECD_RETURN_IF_ERROR(
      RequireSameBits(batched, whole, vocab, "a 20-token prompt alone and beside another"));

  // Greedy decoding (recorded and replayed where the back end records), against the same tokens
  // fed in one pass, and against the CPU fed the same tokens.
  std::vector<float> decoded_rows;
  SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> decoded,
                         DecodeBothWays(engine, whole, decoded_rows));
  std::vector<int32_t> text = prompt;
  text.insert(text.end(), decoded.begin(), decoded.end());
  SPECD_ASSIGN_OR_RETURN(const std::vector<float> text_rows, Feed(engine, 5, text, 0));
  SPECD_RETURN_IF_ERROR(
      RequireSameBits(decoded_rows, std::span<const float>(text_rows).subspan(kPromptLen * vocab),
                      vocab, "greedy decode steps and the same tokens in one pass"));
  SPECD_ASSIGN_OR_RETURN(const std::vector<float> cpu_rows, Feed(*e.cpu, 1, text, 0));
  SPECD_RETURN_IF_ERROR(RequireNearCpu(text_rows, cpu_rows, vocab, tolerance,
                                       "the prompt and its greedy continuation"));

  // A draft tree: node 0 follows the prompt, nodes 1 and 2 are its children (both at the next
  // position). Each node's row must be the bits of its path fed linearly.
  const int32_t sibling = decoded[1] == 3 ? 4 : 3;
  const std::vector<int32_t> nodes = {decoded[0], decoded[1], sibling};
  std::vector<int32_t> feed = prompt;
  feed.insert(feed.end(), nodes.begin(), nodes.end());
  std::vector<int32_t> positions;
  for (int32_t i = 0; i < kPromptLen; ++i) positions.push_back(i);
  positions.insert(positions.end(), {kPromptLen, kPromptLen + 1, kPromptLen + 1});
  const std::vector<uint64_t> masks = {0b001, 0b011, 0b101};
  SequenceInput tree;
  tree.seq = 6;
  tree.tokens = feed;
  tree.positions = positions;
  tree.tree_begin = kPromptLen;
  tree.tree_mask = masks;
  tree.logit_indices = {kPromptLen, kPromptLen + 1, kPromptLen + 2};
  SPECD_ASSIGN_OR_RETURN(const std::vector<float> tree_rows,
                         Run(engine, std::span<const SequenceInput>(&tree, 1)));
  std::vector<int32_t> sibling_path = prompt;
  sibling_path.insert(sibling_path.end(), {decoded[0], sibling});
  SPECD_ASSIGN_OR_RETURN(const std::vector<float> sibling_rows, Feed(engine, 7, sibling_path, 0));
  std::vector<float> linear(decoded_rows.begin(), decoded_rows.begin() + 2 * vocab);
  linear.insert(linear.end(), sibling_rows.end() - vocab, sibling_rows.end());
  SPECD_RETURN_IF_ERROR(RequireSameBits(tree_rows, linear, vocab,
                                        "a draft tree's nodes and their paths fed linearly"));

  // The per-token math on the CPU's logits of the prompt, with the decoded tokens as the output
  // the penalties read. The synthetic model's rows are nearly one-hot, which would leave little
  // to sample, so each is first rescaled to a standard deviation of 1.5: then tens of tokens
  // share the mass and the filters cut somewhere inside it.
  std::vector<float> sampled(cpu_rows.begin(), cpu_rows.begin() + (kSampledRows + 1) * vocab);
  for (int64_t r = 0; r <= kSampledRows; ++r) {
    const std::span<float> row = std::span<float>(sampled).subspan(r * vocab, vocab);
    double sum = 0;
    double sum_sq = 0;
    for (const float x : row) {
      sum += x;
      sum_sq += static_cast<double>(x) * x;
    }
    const double mean = sum / static_cast<double>(vocab);
    const double sd = std::sqrt(std::max(sum_sq / static_cast<double>(vocab) - mean * mean, 1e-12));
    for (float& x : row) x = static_cast<float>((x - mean) / sd * 1.5);
  }
  return CheckSampling(e, sampled, prompt, std::span<const int32_t>(decoded).first(4));
}

}  // namespace

bool NeedsSelfCheck(const kernels::Backend& backend) { return backend.num_threads() == 0; }

ModelConfig SelfCheckConfig(const ModelConfig& served) {
  ModelConfig c = served;
  const int64_t group = served.num_heads / std::max<int64_t>(1, served.num_kv_heads);
  c.num_layers = 2;
  c.num_kv_heads = std::min<int64_t>(served.num_kv_heads, 2);
  c.num_heads = c.num_kv_heads * group;
  c.hidden_size = std::min<int64_t>(served.hidden_size, 256);
  c.intermediate_size = std::min<int64_t>(served.intermediate_size, 384);
  // Under kMinTokenizerVocab: the synthetic checkpoint needs no tokenizer.
  c.vocab_size = 256;
  c.max_position_embeddings = std::max<int64_t>(served.max_position_embeddings, kMaxSeqLen);
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  return c;
}

namespace {

absl::Status RunSelfCheck(const BackendFactory& make, const ModelConfig& served,
                          const EngineOptions& served_options, std::string& backend_name) {
  SPECD_ASSIGN_OR_RETURN(const TempDir dir, TempDir::Create());
  SynthSpec spec;
  spec.config = SelfCheckConfig(served);
  spec.dtype = served.torch_dtype;
  spec.seed = 20261130;
  spec.residual_scale = 0.5;  // layers that matter, so that every op shapes the logits
  SPECD_RETURN_IF_ERROR(WriteSyntheticModel(spec, dir.path()));

  EngineOptions options;
  options.kv_block_size = served_options.kv_block_size;
  options.kv_capacity_tokens = 1024;
  options.max_seq_len = kMaxSeqLen;
  options.kv_dtype = served_options.kv_dtype;
  options.prefix_caching = false;
  // As served: with recording off (--cuda-graphs off) replays are not what would be served.
  options.record_forwards = served_options.record_forwards;
  SPECD_ASSIGN_OR_RETURN(Engines engines, MakeEngines(make, dir.path(), options));
  backend_name = engines.checked->backend().name();
  return RunChecks(engines, options.kv_dtype == kernels::DType::kF32 ? kLogitToleranceF32Kv
                                                                     : kLogitTolerance16BitKv);
}

}  // namespace

absl::Status SelfCheckBackend(const BackendFactory& make, const ModelConfig& served,
                              const EngineOptions& served_options) {
  std::string name = "chosen";
  const absl::Status checked = RunSelfCheck(make, served, served_options, name);
  if (checked.ok()) return checked;
  return absl::Status(
      checked.code(),
      absl::StrCat("the ", name, " back end did not pass its start-up self-check against the CPU ",
                   "back end (", ToAbsl(kernels::DTypeName(served.torch_dtype)), " weights, ",
                   ToAbsl(kernels::DTypeName(served_options.kv_dtype)),
                   " KV cache): ", checked.message(),
                   ". What it generates could differ from the model's, so specd will not serve "
                   "with it; start with --backend cpu, and report this"));
}

}  // namespace specd
