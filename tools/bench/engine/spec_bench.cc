// Speculative decoding in one process (no gRPC): the coordinator's round logic
// (services/coordinator/speculation_round) over two in-process workers, on any back end.
//
//   --check    greedy parity: for every K in --ks, every prompt's speculative output equals plain
//              decoding (DecodePlain on its own engine) token for token, with the prompts decoded
//              one at a time and all together (concurrency). Exit 1 on any difference.
//   --speedup  1 stream: plain decoding (K = 0 rounds) against speculative rounds for each K in
//              --ks, measured side by side; prints tokens/s, the speed-up, the per-token
//              acceptance α (accepted / positions judged), accepted/drafted, and the efficiency
//              against the engine-limited prediction
//              E[tokens/round] * T_t / (K * T_d + T_v(K)), with T_t, T_d and T_v(K) the engines'
//              own forward times measured in the same run.
//
// The draft is the target's first --draft-layers layers (an early-exit draft). Models are a
// checkpoint (--target) or synthetic (--shape, written once under --model-dir).
//
// usage: spec_bench (--check | --speedup) [--backend cpu|cuda] [--target DIR | --shape NAME
//        [--dtype bf16] [--untied] [--residual-scale S]] --draft-layers L [--ks 1,2,4]
//        [--prompts N] [--new-tokens N] [--model-dir DIR] [--threads N]
//        [--prompt-ids 1,2,3 (--speedup: the stream's prompt, as token ids)]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/engine/decode_loop.h"
#include "common/engine/llama_engine.h"
#include "common/synth/synth.h"
#include "services/coordinator/local_worker.h"
#include "services/coordinator/speculation_round.h"
#include "services/coordinator/worker_api.h"
#include "tools/specd/bench/bench_stats.h"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  bool check = false, speedup = false, untied = false;
  kernels::BackendKind backend = kernels::BackendKind::kCpu;
  std::filesystem::path target;
  std::string shape = "tiny", dtype = "f32";
  double residual_scale = 0.1;
  int64_t draft_layers = 1;
  std::vector<int32_t> ks = {1, 2, 3, 4, 5, 6, 7, 8};
  int prompts = 5;
  std::vector<int32_t> prompt_ids;  // --speedup: the one stream's prompt, if given
  int threads = 0;                  // CPU threads per engine; 0: one per core
  int64_t new_tokens = 48;
  std::filesystem::path model_dir = std::filesystem::temp_directory_path() / "specd-spec-bench";
};

absl::StatusOr<std::unique_ptr<LlamaEngine>> Engine(const Options& o, int64_t exit_layer,
                                                    int64_t kv_tokens) {
  EngineOptions options;
  options.kv_capacity_tokens = kv_tokens;
  options.max_seq_len = 4096;
  kernels::BackendOptions backend;
  backend.kind = o.backend;
  backend.num_threads = o.threads;
  LoadOptions load;
  load.exit_layer = exit_layer;
  return CreateEngine(o.target, backend, options, load);
}

absl::StatusOr<std::unique_ptr<LocalWorker>> Worker(const Options& o, int64_t exit_layer) {
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = Engine(o, exit_layer, 65536);
  if (!engine.ok()) return engine.status();
  return std::make_unique<LocalWorker>(
      std::make_unique<WorkerRuntime>(*std::move(engine), WorkerRuntimeOptions{}));
}

std::vector<std::vector<int32_t>> Prompts(const Options& o, int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < o.prompts; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 4 + 5 * p; ++j) {
      prompt.push_back(static_cast<int32_t>(3 + (p * 7919 + j * 104729) % (vocab - 3)));
    }
    prompts.push_back(prompt);
  }
  return prompts;
}

struct RunStats {
  double seconds = 0;
  // judged: draft positions the target judged, up to and including a round's first rejection.
  int64_t drafted = 0, accepted = 0, judged = 0, rounds = 0;
  absl::Duration draft_forward, verify_forward;
  int64_t draft_steps = 0;
};

// Generates new_tokens for every sequence of `seqs` together, round after round.
absl::StatusOr<RunStats> Generate(WorkerApi& draft, WorkerApi& target,
                                  std::vector<SpeculativeSequence>& seqs, int64_t new_tokens) {
  RunStats stats;
  std::vector<size_t> want;
  for (SpeculativeSequence& s : seqs) {
    want.push_back(s.tokens.size() + static_cast<size_t>(new_tokens));
    s.done_len = static_cast<int64_t>(want.back());
  }
  const auto t0 = Clock::now();
  while (true) {
    std::vector<SpeculativeSequence*> running;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].tokens.size() < want[i]) running.push_back(&seqs[i]);
    }
    if (running.empty()) break;
    RoundPhaseTimes phases;
    RoundOptions options;
    options.max_seq_len = 4096;
    options.phase_times = &phases;
    options.prefill_chunk = 512;
    for (const RoundStats& st : RunSpeculationRound(draft, target, running, options)) {
      if (!st.status.ok()) return st.status;
      stats.drafted += st.drafted;
      stats.accepted += st.accepted;
      stats.judged += st.accepted + (st.accepted < st.drafted ? 1 : 0);
    }
    ++stats.rounds;
    stats.draft_forward += phases.draft_forward;
    stats.verify_forward += phases.verify_forward;
    stats.draft_steps += phases.draft_steps;
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.resize(want[i]);
  for (SpeculativeSequence& s : seqs) {
    (void)target.Release(s.id);
    (void)draft.Release(s.id);
  }
  return stats;
}

std::vector<SpeculativeSequence> Sequences(const std::vector<std::vector<int32_t>>& prompts,
                                           int32_t k, int64_t first_id) {
  std::vector<SpeculativeSequence> seqs(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    seqs[p].id = first_id + static_cast<int64_t>(p);
    seqs[p].tokens = prompts[p];
    seqs[p].prompt_len = static_cast<int64_t>(prompts[p].size());
    seqs[p].sampling.temperature = 0.0f;
    seqs[p].num_speculative_tokens = k;
  }
  return seqs;
}

int Check(const Options& o) {
  absl::StatusOr<std::unique_ptr<LlamaEngine>> plain = Engine(o, 0, 65536);
  absl::StatusOr<std::unique_ptr<LocalWorker>> target = Worker(o, 0);
  absl::StatusOr<std::unique_ptr<LocalWorker>> draft = Worker(o, o.draft_layers);
  for (const absl::Status& st : {plain.status(), target.status(), draft.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  std::printf("greedy parity on %s: %d prompts x %ld tokens, draft = first %ld layers\n",
              std::string((*plain)->backend().name()).c_str(), o.prompts,
              static_cast<long>(o.new_tokens), static_cast<long>(o.draft_layers));
  const std::vector<std::vector<int32_t>> prompts = Prompts(o, (*plain)->config().vocab_size);
  std::vector<std::vector<int32_t>> expected;
  for (const std::vector<int32_t>& prompt : prompts) {
    DecodeRequest req;
    req.prompt = prompt;
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = o.new_tokens;
    absl::StatusOr<DecodeResult> out = DecodePlain(**plain, 1, req);
    if (!out.ok()) {
      std::fprintf(stderr, "plain decoding: %s\n", std::string(out.status().message()).c_str());
      return 1;
    }
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), out->tokens.begin(), out->tokens.end());
    expected.push_back(full);
  }
  int failures = 0;
  int64_t next_id = 1000;
  for (const int32_t k : o.ks) {
    for (const bool together : {false, true}) {
      int64_t drafted = 0, accepted = 0, mismatched = 0;
      std::vector<std::vector<int32_t>> got;
      if (together) {
        std::vector<SpeculativeSequence> seqs = Sequences(prompts, k, next_id);
        next_id += o.prompts;
        absl::StatusOr<RunStats> st = Generate(**draft, **target, seqs, o.new_tokens);
        if (!st.ok()) {
          std::fprintf(stderr, "K=%d: %s\n", k, std::string(st.status().message()).c_str());
          return 1;
        }
        drafted += st->drafted, accepted += st->accepted;
        for (const SpeculativeSequence& s : seqs) got.push_back(s.tokens);
      } else {
        for (const std::vector<int32_t>& prompt : prompts) {
          std::vector<SpeculativeSequence> seqs = Sequences({prompt}, k, next_id++);
          absl::StatusOr<RunStats> st = Generate(**draft, **target, seqs, o.new_tokens);
          if (!st.ok()) {
            std::fprintf(stderr, "K=%d: %s\n", k, std::string(st.status().message()).c_str());
            return 1;
          }
          drafted += st->drafted, accepted += st->accepted;
          got.push_back(seqs[0].tokens);
        }
      }
      for (size_t p = 0; p < prompts.size(); ++p) {
        if (got[p] == expected[p]) continue;
        ++mismatched;
        size_t at = 0;
        while (at < got[p].size() && got[p][at] == expected[p][at]) ++at;
        std::printf("  MISMATCH K=%d %s prompt %zu: first difference at position %zu\n", k,
                    together ? "batched" : "alone", p, at);
      }
      failures += mismatched > 0 ? 1 : 0;
      std::printf("K=%d %-8s %s  (acceptance %.3f over %ld drafts)\n", k,
                  together ? "batched" : "alone", mismatched == 0 ? "identical" : "DIFFERENT",
                  drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0,
                  static_cast<long>(drafted));
    }
  }
  const int64_t leaked = (*target)->runtime().engine().kv().used_blocks() +
                         (*draft)->runtime().engine().kv().used_blocks();
  std::printf(
      "%s: greedy speculative == plain for every K (%d failing cases); KV blocks left "
      "in use: %ld\n",
      failures == 0 && leaked == 0 ? "PASS" : "FAIL", failures, static_cast<long>(leaked));
  return failures == 0 && leaked == 0 ? 0 : 1;
}

int Speedup(const Options& o) {
  absl::StatusOr<std::unique_ptr<LocalWorker>> target = Worker(o, 0);
  absl::StatusOr<std::unique_ptr<LocalWorker>> draft = Worker(o, o.draft_layers);
  if (!target.ok() || !draft.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string((target.ok() ? draft.status() : target.status()).message()).c_str());
    return 1;
  }
  const std::vector<std::vector<int32_t>> prompts =
      Prompts(o, (*target)->runtime().engine().config().vocab_size);
  const std::vector<std::vector<int32_t>> one = {o.prompt_ids.empty() ? prompts.back()
                                                                      : o.prompt_ids};
  int64_t next_id = 1;
  // Warm-up (and CUDA graph recording) of every shape used below.
  for (const int32_t k : o.ks) {
    std::vector<SpeculativeSequence> seqs = Sequences(one, k, next_id++);
    (void)Generate(**draft, **target, seqs, 8);
  }
  std::vector<SpeculativeSequence> plain_seqs = Sequences(one, 0, next_id++);
  absl::StatusOr<RunStats> plain = Generate(**draft, **target, plain_seqs, o.new_tokens);
  if (!plain.ok()) {
    std::fprintf(stderr, "%s\n", std::string(plain.status().message()).c_str());
    return 1;
  }
  const double plain_tok_s = static_cast<double>(o.new_tokens) / plain->seconds;
  const double t_t = absl::ToDoubleSeconds(plain->verify_forward) / plain->rounds;
  std::printf("speculative speed-up on %s, 1 stream, %ld new tokens, draft = first %ld layers\n",
              std::string((*target)->runtime().engine().backend().name()).c_str(),
              static_cast<long>(o.new_tokens), static_cast<long>(o.draft_layers));
  std::printf("plain: %.1f tokens/s, T_t %.3f ms\n", plain_tok_s, t_t * 1e3);
  std::printf("%-3s %12s %9s %10s %15s %10s %10s %12s %11s\n", "K", "tokens/s", "speed-up", "alpha",
              "accepted/drafted", "T_d ms", "T_v ms", "predicted", "efficiency");
  for (const int32_t k : o.ks) {
    std::vector<SpeculativeSequence> seqs = Sequences(one, k, next_id++);
    absl::StatusOr<RunStats> st = Generate(**draft, **target, seqs, o.new_tokens);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.status().message()).c_str());
      return 1;
    }
    const double tok_s = static_cast<double>(o.new_tokens) / st->seconds;
    // Leviathan's per-token acceptance, which the prediction's E[tokens] needs; accepted/drafted
    // reads lower, as drafts after a rejection are never judged.
    const double alpha = st->judged > 0 ? static_cast<double>(st->accepted) / st->judged : 0;
    const double t_d =
        st->draft_steps > 0 ? absl::ToDoubleSeconds(st->draft_forward) / st->draft_steps : 0;
    const double t_v = absl::ToDoubleSeconds(st->verify_forward) / st->rounds;
    const double predicted = bench::EngineLimitedSpeedup(alpha, k, t_t, t_d, t_v);
    const double speedup = tok_s / plain_tok_s;
    const std::string drafts = absl::StrCat(st->accepted, "/", st->drafted);
    std::printf("%-3d %12.1f %9.3f %10.3f %15s %10.3f %10.3f %12.3f %11.3f\n", k, tok_s, speedup,
                alpha, drafts.c_str(), t_d * 1e3, t_v * 1e3, predicted, speedup / predicted);
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--check") {
      o.check = true;
      continue;
    }
    if (flag == "--speedup") {
      o.speedup = true;
      continue;
    }
    if (flag == "--untied") {
      o.untied = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (flag == "--backend") {
      absl::StatusOr<kernels::BackendKind> kind = kernels::ParseBackendKind(v);
      if (!kind.ok()) return 2;
      o.backend = *kind;
    } else if (flag == "--target") {
      o.target = v;
    } else if (flag == "--shape") {
      o.shape = v;
    } else if (flag == "--dtype") {
      o.dtype = v;
    } else if (flag == "--residual-scale") {
      o.residual_scale = std::atof(v.c_str());
    } else if (flag == "--draft-layers") {
      o.draft_layers = std::atoll(v.c_str());
    } else if (flag == "--ks") {
      o.ks.clear();
      for (const std::string& k : std::vector<std::string>(absl::StrSplit(v, ','))) {
        o.ks.push_back(std::atoi(k.c_str()));
      }
    } else if (flag == "--prompts") {
      o.prompts = std::atoi(v.c_str());
    } else if (flag == "--prompt-ids") {
      for (const std::string& id : std::vector<std::string>(absl::StrSplit(v, ','))) {
        o.prompt_ids.push_back(std::atoi(id.c_str()));
      }
    } else if (flag == "--threads") {
      o.threads = std::atoi(v.c_str());
    } else if (flag == "--new-tokens") {
      o.new_tokens = std::atoll(v.c_str());
    } else if (flag == "--model-dir") {
      o.model_dir = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (o.check == o.speedup) {
    std::fprintf(stderr, "give one of --check and --speedup\n");
    return 2;
  }
  if (o.target.empty()) {
    absl::StatusOr<ModelConfig> shape = ShapePreset(o.shape);
    absl::StatusOr<kernels::DType> dtype = kernels::ParseKvDType(o.dtype);
    if (!shape.ok() || !dtype.ok()) {
      std::fprintf(stderr, "bad --shape or --dtype\n");
      return 2;
    }
    if (o.untied) shape->tie_word_embeddings = false;
    o.target = o.model_dir / (o.shape + (shape->tie_word_embeddings ? "-tied-" : "-untied-") +
                              o.dtype + "-s" + std::to_string(o.residual_scale));
    if (!std::filesystem::exists(o.target / "config.json")) {
      std::fprintf(stderr, "writing a %s-shaped %s model to %s ...\n", o.shape.c_str(),
                   o.dtype.c_str(), o.target.c_str());
      SynthSpec spec;
      spec.config = *shape;
      spec.dtype = *dtype;
      spec.residual_scale = o.residual_scale;
      if (absl::Status st = WriteSyntheticModel(spec, o.target); !st.ok()) {
        std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
  }
  return o.check ? Check(o) : Speedup(o);
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
