// Single-sequence decode throughput and (K+1)-token verification cost of the engine on a
// synthetic model, against the memory bandwidth measured in the same run.
//
// The bandwidth bound is the tokens/s a decode step would reach if it did nothing but stream the
// weights it must read once per token (every matrix, the classifier and one embedding row) at
// the measured bandwidth. Decode at batch 1 is memory-bound, so that is the ceiling.
//  * CPU: the read bandwidth of the weights' own memory (best of three passes).
//  * CUDA: the device-to-device copy bandwidth, counting bytes read and written, of 1 GiB
//    buffers (best of five), next to decode with and without CUDA graphs (--graphs) and
//    programmatic dependent launches (--pdl).
//
// usage: decode_bench [--backend cpu|cuda] [--shape NAME] [--dtypes f32,bf16] [--threads 1,2]
//                     [--untied] [--graphs on,off] [--pdl on,off] [--steps N] [--context N]
//                     [--k K] [--model-dir DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/engine/llama_engine.h"
#include "common/synth/synth.h"
#include "kernels/cpu/bandwidth.h"
#include "tools/bench/device_copy.h"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;

int64_t WeightBytesPerToken(const DeviceWeights& w, const ModelConfig& c) {
  auto bytes = [](const kernels::WeightView& v) {
    return v.rows * v.cols * kernels::DTypeSize(v.dtype);
  };
  int64_t total = w.embed.cols * kernels::DTypeSize(w.embed.dtype);  // one embedding row
  total += bytes(w.lm_head);
  for (const DeviceLayerWeights& l : w.layers) {
    total += bytes(l.wq) + bytes(l.wk) + bytes(l.wv) + bytes(l.wo) + bytes(l.w_gate) +
             bytes(l.w_up) + bytes(l.w_down);
    total += 2 * c.hidden_size * 4;  // the two norm weights
  }
  return total + c.hidden_size * 4;  // the final norm
}

// Read bandwidth of the very memory CPU decode streams (the weight buffer, on huge pages), best
// of three passes. A separate buffer can sit on pages or host memory of another speed.
double CpuWeightReadGBps(const DeviceWeights& w, const ModelConfig& c, int threads) {
  absl::StatusOr<std::unique_ptr<kernels::ReadBandwidthProbe>> probe =
      kernels::ReadBandwidthProbe::Create(threads, 1 << 20);
  if (!probe.ok() || w.matrices.empty()) return 0;
  const size_t n = std::min(static_cast<size_t>(w.matrices.bytes()),
                            static_cast<size_t>(WeightBytesPerToken(w, c)));
  double best = 0;
  uint64_t sink = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    sink += (*probe)->Read(w.matrices.data(), n);
    best = std::max(best, n / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  if (sink == 42) std::fprintf(stderr, " ");  // keeps the reads observable
  return best;
}

// Seconds per forward call feeding `n` tokens at a fixed context length `context` (the sequence is
// truncated back after each call, so every call sees the same KV length).
double TimeForward(LlamaEngine& engine, int64_t context, int n, int reps) {
  std::vector<int32_t> prompt(static_cast<size_t>(context));
  for (int64_t i = 0; i < context; ++i)
    prompt[static_cast<size_t>(i)] = static_cast<int32_t>(3 + i * 7 % 900);
  const KvPool::SeqId seq = 1;
  (void)engine.Release(seq);
  if (!engine.AddSequence(seq).ok()) return -1;
  SequenceInput pre;
  pre.seq = seq;
  pre.tokens = prompt;
  pre.start_pos = 0;
  if (!engine.Forward(std::span<const SequenceInput>(&pre, 1)).ok()) return -1;
  if (!engine.Synchronize().ok()) return -1;
  std::vector<int32_t> step(static_cast<size_t>(n), 42);
  SequenceInput in;
  in.seq = seq;
  in.tokens = step;
  in.start_pos = context;
  for (int i = 0; i < n; ++i) in.logit_indices.push_back(i);
  double best = 1e30;
  // Best of three batches of `reps` (after a warm-up that also records the shape): the machine
  // may be shared, and the minimum is the least noisy.
  for (int round = 0; round < 4; ++round) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      if (!engine.Forward(std::span<const SequenceInput>(&in, 1)).ok()) return -1;
      if (!engine.Synchronize().ok()) return -1;
      (void)engine.Truncate(seq, context);
    }
    if (round > 0) {
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
    }
  }
  (void)engine.Release(seq);
  return best;
}

std::vector<std::string> List(const std::string& s) { return absl::StrSplit(s, ','); }

int Main(int argc, char** argv) {
  int steps = 32, context = 64, k = 4;
  std::string backend_name = "cpu", shape_name = "stories110M", dtypes = "", threads = "1,2";
  std::string graphs = "on,off", pdl = "on";
  bool untied = false;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "specd-decode-bench";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--untied") {
      untied = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string value = argv[++i];
    if (flag == "--steps") {
      steps = std::atoi(value.c_str());
    } else if (flag == "--context") {
      context = std::atoi(value.c_str());
    } else if (flag == "--k") {
      k = std::atoi(value.c_str());
    } else if (flag == "--model-dir") {
      dir = value;
    } else if (flag == "--backend") {
      backend_name = value;
    } else if (flag == "--shape") {
      shape_name = value;
    } else if (flag == "--dtypes") {
      dtypes = value;
    } else if (flag == "--threads") {
      threads = value;
    } else if (flag == "--graphs") {
      graphs = value;
    } else if (flag == "--pdl") {
      pdl = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  absl::StatusOr<kernels::BackendKind> kind = kernels::ParseBackendKind(backend_name);
  absl::StatusOr<ModelConfig> shape = ShapePreset(shape_name);
  if (!kind.ok() || !shape.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string((kind.ok() ? shape.status() : kind.status()).message()).c_str());
    return 2;
  }
  const bool gpu = *kind != kernels::BackendKind::kCpu;
  if (dtypes.empty()) dtypes = gpu ? "bf16" : "f32,bf16";
  if (untied) shape->tie_word_embeddings = false;

  struct Row {
    std::string dtype, config;
    double tok_s, bound_frac, verify_ratio, gbps;
  };
  std::vector<Row> rows;
  std::string backend_label;
  for (const std::string& dtype_name : List(dtypes)) {
    absl::StatusOr<kernels::DType> dtype = kernels::ParseKvDType(dtype_name);
    if (!dtype.ok()) {
      std::fprintf(stderr, "--dtypes: %s\n", std::string(dtype.status().message()).c_str());
      return 2;
    }
    const std::filesystem::path model =
        dir / (shape_name + (shape->tie_word_embeddings ? "-tied-" : "-untied-") + dtype_name);
    if (!std::filesystem::exists(model / "config.json")) {
      std::fprintf(stderr, "writing %s-shaped %s model to %s ...\n", shape_name.c_str(),
                   dtype_name.c_str(), model.c_str());
      SynthSpec spec;
      spec.config = *shape;
      spec.dtype = *dtype;
      if (absl::Status st = WriteSyntheticModel(spec, model); !st.ok()) {
        std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    // On a GPU: every pairing of CUDA graphs and programmatic launches asked for.
    std::vector<std::pair<std::string, std::string>> configs;
    if (gpu) {
      for (const std::string& g : List(graphs)) {
        for (const std::string& p : List(pdl)) configs.emplace_back(g, p);
      }
    } else {
      for (const std::string& t : List(threads)) configs.emplace_back(t, "");
    }
    for (const auto& [config, pdl_config] : configs) {
      const std::string label =
          gpu ? absl::StrCat("graphs ", config, ", pdl ", pdl_config) : "threads " + config;
      std::fprintf(stderr, "measuring %s, %s ...\n", dtype_name.c_str(), label.c_str());
      EngineOptions options;
      options.kv_capacity_tokens = 4096;
      options.max_seq_len = 4096;
      kernels::BackendOptions backend;
      backend.kind = *kind;
      if (gpu) {
        options.record_forwards = config == "on";
        backend.programmatic_launch = pdl_config == "on";
      } else {
        backend.num_threads = std::atoi(config.c_str());
      }
      absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateEngine(model, backend, options);
      if (!engine.ok()) {
        std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
        return 1;
      }
      backend_label = std::string((*engine)->backend().name());
      const double gbps =
          gpu ? DeviceCopyGBps((*engine)->backend())
              : CpuWeightReadGBps((*engine)->weights(), (*engine)->config(), backend.num_threads);
      if (gbps <= 0) return 1;
      const double t1 = TimeForward(**engine, context, 1, steps);
      const double tk = TimeForward(**engine, context, k + 1, steps);
      if (t1 <= 0 || tk <= 0) return 1;
      const double bytes =
          static_cast<double>(WeightBytesPerToken((*engine)->weights(), (*engine)->config()));
      const double tok_s = 1.0 / t1;
      rows.push_back({dtype_name, label, tok_s, bytes * tok_s / (gbps * 1e9), tk / t1, gbps});
    }
  }
  std::printf("%s-shaped synthetic model (%s classifier) on %s, context %d, K = %d\n",
              shape_name.c_str(), shape->tie_word_embeddings ? "tied" : "untied",
              backend_label.c_str(), context, k);
  std::printf("%-6s %-12s %14s %12s %14s %16s\n", "dtype", "config",
              gpu ? "copy GB/s" : "read GB/s", "decode tok/s", "of bw bound", "T_v(K)/T_t");
  for (const Row& r : rows) {
    std::printf("%-6s %-12s %14.1f %12.2f %14.3f %16.3f\n", r.dtype.c_str(), r.config.c_str(),
                r.gbps, r.tok_s, r.bound_frac, r.verify_ratio);
  }
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
