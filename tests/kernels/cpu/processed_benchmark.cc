// Rows per second of the processed distribution at Llama-3 vocabulary size, for the parameter
// mixes a server sees. Run: build/tests/kernels/cpu/sampling_benchmark
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/processed.h"

namespace specd::kernels::cpu {
namespace {

constexpr int64_t kVocab = 128256;

std::vector<float> RandomLogits() {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

void RunProcessed(benchmark::State& state, const SamplingParams& params, int64_t history_len) {
  const std::vector<float> logits = RandomLogits();
  std::vector<int32_t> history(history_len);
  for (int64_t i = 0; i < history_len; ++i) history[i] = static_cast<int32_t>((i * 7919) % kVocab);
  std::vector<float> probs(kVocab);
  LogitsProcessor processor;
  for ([[maybe_unused]] auto _ : state) {
    const absl::Status status =
        processor.ProcessedDistribution(logits, params, {history, history}, probs);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
    benchmark::DoNotOptimize(probs.data());
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Plain(benchmark::State& state) { RunProcessed(state, SamplingParams{}, 0); }
void BM_TopK50(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 50;
  RunProcessed(state, p, 0);
}
void BM_TopP095(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  RunProcessed(state, p, 0);
}
void BM_TopKTopPMinP(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  RunProcessed(state, p, 0);
}
void BM_PenaltiesLongHistory(benchmark::State& state) {
  SamplingParams p;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.2f;
  p.top_p = 0.95f;
  RunProcessed(state, p, 4096);
}
void BM_SampleInverseCdf(benchmark::State& state) {
  std::vector<float> probs(kVocab);
  LogitsProcessor processor;
  (void)processor.ProcessedDistribution(RandomLogits(), SamplingParams{}, {}, probs);
  uint32_t pos = 0;
  for ([[maybe_unused]] auto _ : state) {
    benchmark::DoNotOptimize(SampleInverseCdf(probs, StreamUniform(3, pos++, Purpose::kBonus)));
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_Plain);
BENCHMARK(BM_TopK50);
BENCHMARK(BM_TopP095);
BENCHMARK(BM_TopKTopPMinP);
BENCHMARK(BM_PenaltiesLongHistory);
BENCHMARK(BM_SampleInverseCdf);

}  // namespace
}  // namespace specd::kernels::cpu

BENCHMARK_MAIN();
