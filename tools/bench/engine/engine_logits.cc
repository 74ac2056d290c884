// Logits and greedy tokens of specd's engine for given prompts, for comparison with an
// independent implementation (tests/reference/hf_parity.py runs Hugging Face transformers on the
// same checkpoint). Needs no gRPC, so it builds in the engine-only configuration.
//
// usage: engine_logits --model DIR --prompts FILE --out DIR [--backend cpu|cuda] [--greedy N]
//   FILE: JSON {"prompts": [[token ids], ...]}.
//   Writes DIR/logits_<p>.f32 (float32 [prompt length, vocab], the next-token logits after every
//   prefix, from one forward pass over the prompt) and DIR/greedy.json
//   ({"tokens": [[N greedy tokens], ...]}, plain decoding with temperature 0).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/engine/decode_loop.h"
#include "common/engine/llama_engine.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "engine_logits: %s\n", what.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  std::filesystem::path model, prompts_file, out;
  std::string backend_name = "cpu";
  int64_t greedy = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model = value;
    } else if (flag == "--prompts") {
      prompts_file = value;
    } else if (flag == "--out") {
      out = value;
    } else if (flag == "--backend") {
      backend_name = value;
    } else if (flag == "--greedy") {
      greedy = std::atoll(value.c_str());
    } else {
      return Fail("unknown flag " + flag);
    }
  }
  if (model.empty() || prompts_file.empty() || out.empty()) {
    return Fail("--model, --prompts and --out are required");
  }
  std::ifstream in(prompts_file);
  if (!in) return Fail("cannot read " + prompts_file.string());
  const nlohmann::json spec = nlohmann::json::parse(in, nullptr, false);
  if (spec.is_discarded() || !spec.contains("prompts")) return Fail("bad prompts file");
  const std::vector<std::vector<int32_t>> prompts = spec["prompts"];
  absl::StatusOr<kernels::BackendKind> kind = kernels::ParseBackendKind(backend_name);
  if (!kind.ok()) return Fail(std::string(kind.status().message()));
  kernels::BackendOptions backend;
  backend.kind = *kind;
  EngineOptions options;
  options.kv_capacity_tokens = 8192;
  options.max_seq_len = 4096;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateEngine(model, backend, options);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  std::filesystem::create_directories(out);
  nlohmann::json greedy_out;
  greedy_out["backend"] = std::string((*engine)->backend().name());
  greedy_out["tokens"] = nlohmann::json::array();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const KvPool::SeqId seq = static_cast<KvPool::SeqId>(p + 1);
    if (absl::Status st = (*engine)->AddSequence(seq); !st.ok())
      return Fail(std::string(st.message()));
    SequenceInput input;
    input.seq = seq;
    input.tokens = prompts[p];
    for (size_t i = 0; i < prompts[p].size(); ++i)
      input.logit_indices.push_back(static_cast<int32_t>(i));
    absl::StatusOr<Logits> logits = (*engine)->Forward(std::span<const SequenceInput>(&input, 1));
    if (!logits.ok()) return Fail(std::string(logits.status().message()));
    absl::StatusOr<std::vector<float>> host = (*engine)->ReadLogits(*logits);
    if (!host.ok()) return Fail(std::string(host.status().message()));
    (void)(*engine)->Release(seq);
    std::ofstream f(out / ("logits_" + std::to_string(p) + ".f32"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(host->data()),
            static_cast<std::streamsize>(host->size() * sizeof(float)));
    if (!f) return Fail("cannot write logits");
    if (greedy > 0) {
      DecodeRequest req;
      req.prompt = prompts[p];
      req.sampling.temperature = 0.0f;
      req.max_new_tokens = greedy;
      absl::StatusOr<DecodeResult> result = DecodePlain(**engine, seq, req);
      if (!result.ok()) return Fail(std::string(result.status().message()));
      greedy_out["tokens"].push_back(result->tokens);
    }
  }
  std::ofstream g(out / "greedy.json");
  g << greedy_out.dump() << "\n";
  return g ? 0 : Fail("cannot write greedy.json");
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
