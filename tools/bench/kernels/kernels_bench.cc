// Weight-streaming throughput of the CPU back end's Matmul, as a fraction of the machine's read
// bandwidth measured in the same run (validate-then-benchmark, in the spirit of llm.c's dev/cuda).
//
// For every weight shape of a Llama 110M model (dim 768, hidden 2048, vocab 32000), dtype and
// thread count it times a matvec (1 token) and a K+1 = 5 token matmul. Each timed pass reads a
// different copy of the weight per call, cycling through more memory than the last-level cache
// holds, so the numbers are DRAM numbers as in a real decode step. Then it times the matmuls of
// one whole decode step of that model (12 layers of q, k, v, o, gate, up, down plus the
// classifier, each with its own weights, in one arena as a loader would allocate them), once on
// 4 KiB pages and once on 2 MiB transparent huge pages: on a virtual machine the page size alone
// can change the read bandwidth of one core by ~1.7x.
//
// Each pass is paired with a "probe" pass that only reads the very same weight bytes in the same
// order, with the same threads and the back end's fastest loads (ReadBandwidthProbe::Read; on a
// virtual machine two buffers can sit on host memory of different speed, so the probe reads the
// kernel's own memory). Passes are interleaved round by round. Times and GB/s are the fastest
// round (other processes only ever slow a pass down); "of bw" is the median over rounds of
// probe time / kernel time, so a shared machine whose bandwidth swings from moment to moment
// still gives a fair ratio. MeasureReadBandwidthGBps's figure for a 1 GiB buffer is printed
// first for reference.
//
// Usage: specd_kernels_bench            (no flags; prints tables, takes a minute or two)
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/math.h"
#include "kernels/backend.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

namespace specd::kernels {
namespace {

constexpr size_t kTopBandwidthBytes = size_t{1} << 30;

// Checksums of the probe's reads, kept so the reads cannot be optimised away.
uint64_t g_sink = 0;
constexpr int64_t kMinStreamBytes = int64_t{256} << 20;  // per pass: far beyond any L3
constexpr int kRounds = 25;
constexpr int kVerifyTokens = 5;  // K + 1 with K = 4
constexpr int kThreadCounts[] = {1, 2};

void Die(const absl::Status& status) {
  std::fprintf(stderr, "specd_kernels_bench: %s\n", std::string(status.message()).c_str());
  std::exit(1);
}

// Fills `elements` weights of one dtype at `out` with small finite values (speed does not depend
// on them; they must just never meet NaN or denormal slow paths).
void FillWeights(DType dtype, int64_t elements, std::mt19937& rng, uint8_t* out) {
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  for (int64_t i = 0; i < elements; ++i) {
    const float f = dist(rng);
    if (dtype == DType::kF32) {
      std::memcpy(out + i * 4, &f, 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? F32ToF16(f) : F32ToBf16(f);
      std::memcpy(out + i * 2, &h, 2);
    }
  }
}

std::vector<uint8_t> MakeWeights(DType dtype, int64_t elements, std::mt19937& rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(elements * DTypeSize(dtype)));
  FillWeights(dtype, elements, rng, bytes.data());
  return bytes;
}

// One block of anonymous memory for all weights of a model, as a loader would allocate it;
// with `huge_pages` Linux is asked to back it with 2 MiB transparent huge pages.
class Arena {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  Arena(size_t bytes, bool huge_pages) {
    const auto rounded = static_cast<size_t>(
        RoundUpTo(static_cast<int64_t>(bytes), static_cast<int64_t>(kHugePage)));
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kHugePage, rounded)));
    if (data_ == nullptr) Die(absl::ResourceExhaustedError("cannot allocate the weight arena"));
#if defined(__linux__)
    if (huge_pages) madvise(data_.get(), rounded, MADV_HUGEPAGE);
#else
    (void)huge_pages;
#endif
  }
  uint8_t* data() { return data_.get(); }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, FreeDeleter> data_;
};

double SecondsOf(const std::function<void()>& pass) {
  const auto start = std::chrono::steady_clock::now();
  pass();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds of each pass in each round, after one warm-up round. Pass 0 is the read probe.
std::vector<std::vector<double>> Interleaved(const std::vector<std::function<void()>>& passes) {
  for (const auto& pass : passes) pass();
  std::vector<std::vector<double>> seconds(passes.size());
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < passes.size(); ++i) seconds[i].push_back(SecondsOf(passes[i]));
  }
  return seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Pass i read the same `bytes` as the probe (pass 0) in every round: its fastest time and rate,
// and the median over rounds of (probe time / its time), i.e. its rate as a fraction of plain
// reads of the same memory under the same load.
struct Rate {
  double seconds;
  double gbps;
  double of_bandwidth;
};

Rate RateOf(const std::vector<std::vector<double>>& seconds, size_t i, double bytes) {
  Rate r{1e30, 0.0, 0.0};
  std::vector<double> ratios;
  for (size_t round = 0; round < seconds[i].size(); ++round) {
    r.seconds = std::min(r.seconds, seconds[i][round]);
    ratios.push_back(seconds[0][round] / seconds[i][round]);
  }
  r.gbps = bytes / r.seconds / 1e9;
  r.of_bandwidth = Median(ratios);
  return r;
}

struct Shape {
  const char* name;
  int64_t rows;
  int64_t cols;
};

void BenchShapes(const std::vector<std::unique_ptr<ReadBandwidthProbe>>& probes) {
  const Shape shapes[] = {{"attn q/k/v/o", 768, 768},
                          {"mlp gate/up", 2048, 768},
                          {"mlp down", 768, 2048},
                          {"classifier", 32000, 768}};
  std::printf(
      "\nOne weight matrix (GB/s of weight bytes read; 'of bw': see the top of the file)\n");
  std::printf("%-13s %-10s %-5s %-3s | %6s | %9s %7s %6s | %9s %7s %6s | %s\n", "weight", "shape",
              "dtype", "thr", "probe", "1 tok us", "GB/s", "of bw", "5 tok us", "GB/s", "of bw",
              "5 tok/1 tok");
  std::mt19937 rng(1);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : shapes) {
      const int64_t elements = shape.rows * shape.cols;
      const int64_t bytes = elements * DTypeSize(dtype);
      const int64_t copies = std::max<int64_t>(2, (kMinStreamBytes + bytes - 1) / bytes);
      const std::vector<uint8_t> weights = MakeWeights(dtype, elements * copies, rng);
      std::vector<float> x(static_cast<size_t>(kVerifyTokens * shape.cols), 0.01f);
      std::vector<float> y(static_cast<size_t>(kVerifyTokens * shape.rows));
      for (size_t ti = 0; ti < std::size(kThreadCounts); ++ti) {
        auto backend = CreateCpuBackend(kThreadCounts[ti]);
        if (!backend.ok()) Die(backend.status());
        std::vector<std::function<void()>> passes;
        passes.push_back([&] {
          for (int64_t i = 0; i < copies; ++i) {
            g_sink += probes[ti]->Read(weights.data() + i * bytes, static_cast<size_t>(bytes));
          }
        });
        for (const int64_t n_tokens : {int64_t{1}, int64_t{kVerifyTokens}}) {
          passes.push_back([&, n_tokens] {
            for (int64_t i = 0; i < copies; ++i) {
              const MatmulArgs args{
                  .x = x.data(),
                  .w = {weights.data() + i * bytes, dtype, shape.rows, shape.cols},
                  .y = y.data(),
                  .n_tokens = n_tokens};
              if (absl::Status s = (*backend)->Matmul(args); !s.ok()) Die(s);
            }
          });
        }
        const auto seconds = Interleaved(passes);
        const double pass_bytes = static_cast<double>(bytes * copies);
        const Rate probe = RateOf(seconds, 0, pass_bytes);
        const Rate r1 = RateOf(seconds, 1, pass_bytes);
        const Rate r5 = RateOf(seconds, 2, pass_bytes);
        const double us1 = 1e6 * r1.seconds / static_cast<double>(copies);
        const double us5 = 1e6 * r5.seconds / static_cast<double>(copies);
        std::printf(
            "%-13s %5lldx%-4lld %-5s %3d | %6.2f | %9.1f %7.2f %5.0f%% | %9.1f %7.2f %5.0f%% | "
            "%.2fx\n",
            shape.name, static_cast<long long>(shape.rows), static_cast<long long>(shape.cols),
            std::string(DTypeName(dtype)).c_str(), kThreadCounts[ti], probe.gbps, us1, r1.gbps,
            100 * r1.of_bandwidth, us5, r5.gbps, 100 * r5.of_bandwidth, us5 / us1);
      }
    }
  }
}

// The matmuls of one decode step of a Llama 110M model, every layer with its own weights, all in
// one arena of 4 KiB or of 2 MiB pages.
void BenchModelStep(const std::vector<std::unique_ptr<ReadBandwidthProbe>>& probes) {
  constexpr int64_t kDim = 768, kHidden = 2048, kVocab = 32000, kLayers = 12;
  struct Matrix {
    int64_t rows, cols;
    size_t offset;
  };
  std::vector<Matrix> mats;
  size_t elements = 0;
  const auto add = [&](int64_t rows, int64_t cols) {
    mats.push_back({rows, cols, elements});
    elements += static_cast<size_t>(rows * cols);
  };
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int i = 0; i < 4; ++i) add(kDim, kDim);
    for (int i = 0; i < 2; ++i) add(kHidden, kDim);
    add(kDim, kHidden);
  }
  add(kVocab, kDim);

  std::printf(
      "\nLlama 110M decode step, matmuls only (12 layers x q,k,v,o,gate,up,down + classifier)\n");
  std::printf("%-5s %-5s %-3s | %6s | %9s %8s %7s %6s | %9s %s\n", "pages", "dtype", "thr", "probe",
              "ms/token", "tok/s", "GB/s", "of bw", "5 tok ms", "5 tok/1 tok");
  std::mt19937 rng(2);
  for (const bool huge_pages : {false, true}) {
    double f32_tok_s[std::size(kThreadCounts)] = {};
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const size_t elem_bytes = static_cast<size_t>(DTypeSize(dtype));
      const size_t step_bytes = elements * elem_bytes;
      Arena arena(step_bytes, huge_pages);
      FillWeights(dtype, static_cast<int64_t>(elements), rng, arena.data());
      std::vector<float> x(static_cast<size_t>(kVerifyTokens * kHidden), 0.01f);
      std::vector<float> y(static_cast<size_t>(kVerifyTokens * kVocab));
      for (size_t ti = 0; ti < std::size(kThreadCounts); ++ti) {
        auto backend = CreateCpuBackend(kThreadCounts[ti]);
        if (!backend.ok()) Die(backend.status());
        std::vector<std::function<void()>> passes;
        passes.push_back([&] { g_sink += probes[ti]->Read(arena.data(), step_bytes); });
        for (const int64_t n_tokens : {int64_t{1}, int64_t{kVerifyTokens}}) {
          passes.push_back([&, n_tokens] {
            for (const Matrix& m : mats) {
              const MatmulArgs args{
                  .x = x.data(),
                  .w = {arena.data() + m.offset * elem_bytes, dtype, m.rows, m.cols},
                  .y = y.data(),
                  .n_tokens = n_tokens};
              if (absl::Status s = (*backend)->Matmul(args); !s.ok()) Die(s);
            }
          });
        }
        const auto seconds = Interleaved(passes);
        const Rate probe = RateOf(seconds, 0, static_cast<double>(step_bytes));
        const Rate r1 = RateOf(seconds, 1, static_cast<double>(step_bytes));
        const Rate r5 = RateOf(seconds, 2, static_cast<double>(step_bytes));
        const double tok_s = 1.0 / r1.seconds;
        if (dtype == DType::kF32) f32_tok_s[ti] = tok_s;
        std::printf("%-5s %-5s %3d | %6.2f | %9.2f %8.1f %7.2f %5.0f%% | %9.2f %.2fx",
                    huge_pages ? "2 MiB" : "4 KiB", std::string(DTypeName(dtype)).c_str(),
                    kThreadCounts[ti], probe.gbps, 1e3 * r1.seconds, tok_s, r1.gbps,
                    100 * r1.of_bandwidth, 1e3 * r5.seconds, r5.seconds / r1.seconds);
        if (dtype != DType::kF32) std::printf("   %.2fx the F32 tok/s", tok_s / f32_tok_s[ti]);
        std::printf("\n");
      }
    }
  }
}

}  // namespace
}  // namespace specd::kernels

int main() {
  namespace k = specd::kernels;
  auto backend = k::CreateCpuBackend(1);
  if (!backend.ok()) k::Die(backend.status());
  std::printf("CPU back end: %s\n", std::string((*backend)->name()).c_str());
  std::vector<std::unique_ptr<k::ReadBandwidthProbe>> probes;
  for (const int threads : k::kThreadCounts) {
    std::printf("MeasureReadBandwidthGBps(%d thread%s, 1 GiB): %.2f GB/s\n", threads,
                threads == 1 ? "" : "s",
                k::MeasureReadBandwidthGBps(threads, k::kTopBandwidthBytes));
    auto probe = k::ReadBandwidthProbe::Create(threads, 4096);
    if (!probe.ok()) k::Die(probe.status());
    probes.push_back(std::move(*probe));
  }
  k::BenchShapes(probes);
  k::BenchModelStep(probes);
  return 0;
}
