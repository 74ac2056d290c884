// ProcessRows (the processed distribution: penalties, temperature, top-k, softmax, top-p, min-p)
// at Llama 3's vocabulary on one back end, for the parameter mixes a server sees and for 1 and 5
// rows (a draft step; a K = 4 verification). A draft worker processes one row per draft step, so
// at batch 1 this sits between every pair of draft forward passes: its microseconds are what a
// sampled request adds to a round beyond greedy.
//
// usage: sampling_rows_bench [--backend cuda|cpu] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kVocab = 128256;
constexpr int64_t kMaxRows = 5;

struct Mix {
  const char* name;
  kernels::RowMode mode;
  SamplingParams params;
};

std::vector<Mix> Mixes() {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams plain;
  plain.temperature = 0.8f;
  SamplingParams top_k = plain;
  top_k.top_k = 50;
  SamplingParams top_p = plain;
  top_p.top_p = 0.95f;
  SamplingParams all = plain;
  all.top_k = 40;
  all.top_p = 0.9f;
  all.min_p = 0.05f;
  return {{"greedy", kernels::RowMode::kGreedy, greedy},
          {"temperature 0.8", kernels::RowMode::kSample, plain},
          {"top-k 50", kernels::RowMode::kSample, top_k},
          {"top-p 0.95", kernels::RowMode::kSample, top_p},
          {"top-k 40 top-p 0.9 min-p", kernels::RowMode::kSample, all}};
}

[[noreturn]] void Die(const absl::Status& status) {
  std::fprintf(stderr, "sampling_rows_bench: %s\n", std::string(status.message()).c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) Die(v.status());
  return *std::move(v);
}

// `bytes` of back-end memory holding `host`'s bytes.
kernels::Buffer Uploaded(kernels::Backend& be, const void* host, int64_t bytes,
                         kernels::MemoryKind kind) {
  kernels::Buffer device = Must(be.Allocate(bytes, kind, "bench input"));
  kernels::Buffer staging = Must(be.Allocate(bytes, kernels::MemoryKind::kStaging, "staging"));
  std::memcpy(staging.data(), host, static_cast<size_t>(bytes));
  if (absl::Status s = be.Upload(device.data(), staging.data(), bytes); !s.ok()) Die(s);
  if (absl::Status s = be.Synchronize(); !s.ok()) Die(s);
  return device;
}

int Main(int argc, char** argv) {
  std::string backend_name = "cuda";
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--backend") {
      backend_name = argv[i + 1];
    } else if (flag == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: sampling_rows_bench [--backend cuda|cpu] [--reps N]\n");
      return 2;
    }
  }
  kernels::BackendOptions options;
  options.kind = Must(kernels::ParseBackendKind(backend_name));
  std::unique_ptr<kernels::Backend> be = Must(kernels::CreateBackend(options));

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(kMaxRows * kVocab));
  for (float& x : logits) x = normal(rng);
  const kernels::Buffer d_logits =
      Uploaded(*be, logits.data(), kMaxRows * kVocab * 4, kernels::MemoryKind::kScratch);
  kernels::Buffer probs =
      Must(be->Allocate(kMaxRows * kVocab * 4, kernels::MemoryKind::kRows, "probability rows"));
  kernels::Buffer argmax =
      Must(be->Allocate(kMaxRows * 4, kernels::MemoryKind::kScratch, "argmax"));
  kernels::Buffer error = Must(be->Allocate(kMaxRows * 4, kernels::MemoryKind::kScratch, "error"));

  std::printf("ProcessRows on %s, vocabulary %ld, microseconds per call (best of 2 rounds of %d)\n",
              std::string(be->name()).c_str(), static_cast<long>(kVocab), reps);
  std::printf("%-26s %10s %10s\n", "mix", "1 row", "5 rows");
  for (const Mix& mix : Mixes()) {
    std::printf("%-26s", mix.name);
    for (const int64_t n : {int64_t{1}, kMaxRows}) {
      std::vector<kernels::RowSampling> rows(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        rows[r].params = mix.params;
        rows[r].mode = mix.mode;
        rows[r].prob_slot = static_cast<int32_t>(r);
      }
      const kernels::Buffer d_rows = Uploaded(*be, rows.data(), n * sizeof(kernels::RowSampling),
                                              kernels::MemoryKind::kScratch);
      kernels::ProcessRowsArgs a;
      a.logits = d_logits.as<float>();
      a.n_rows = n;
      a.vocab = kVocab;
      a.rows = d_rows.as<kernels::RowSampling>();
      a.probs = probs.as<float>();
      a.prob_capacity = kMaxRows;
      a.argmax = argmax.as<int32_t>();
      a.error = error.as<int32_t>();
      double best = 1e30;
      for (int round = 0; round < 3; ++round) {
        const auto t0 = Clock::now();
        for (int i = 0; i < reps; ++i) {
          if (absl::Status s = be->ProcessRows(a); !s.ok()) Die(s);
        }
        if (absl::Status s = be->Synchronize(); !s.ok()) Die(s);
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
        if (round > 0) best = std::min(best, seconds);
      }
      std::printf(" %10.1f", best * 1e6);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
