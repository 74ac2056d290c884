// `specd synth`: synthetic checkpoints (random weights, controllable draft agreement).
#include <iostream>

#include "absl/strings/str_join.h"
#include "common/synth/synth.h"
#include "tools/specd/command.h"
#include "tools/specd/progress.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] =
    "Write a synthetic Llama checkpoint, or an early-exit draft of an existing one.\n"
    "  specd synth --shape stories110M --residual-scale 0.1 --out DIR\n"
    "  specd synth --early-exit-of TARGET_DIR --layers 2 --out DIR";

int RunSynth(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"out", "output directory", "", false, true},
      {"shape", "shape preset: " + absl::StrJoin(ShapePresetNames(), ", "), "tiny"},
      {"dtype", "weight dtype: f32, bf16 or f16", "f32"},
      {"seed", "random seed", "1"},
      {"residual-scale",
       "scale s of attention/MLP output projections; smaller s = an early-exit draft agrees more",
       "0.1"},
      {"vocab", "override the preset's vocabulary size", ""},
      {"layers", "override the number of layers (or, with --early-exit-of, layers to keep)", ""},
      {"shards", "number of safetensors shards to write", "1"},
      {"tied", "tie the classifier to the embedding", "", true},
      {"early-exit-of", "write a draft keeping the first --layers layers of this checkpoint", ""},
  };
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("synth", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  const std::filesystem::path out = args->Get("out");
  Progress progress("synth");
  auto report = [&progress](int64_t done, int64_t total) { progress.Update(done, total, "bytes"); };

  if (args->Has("early-exit-of")) {
    if (!args->Has("layers")) {
      return ReportError("synth", absl::InvalidArgumentError("--early-exit-of needs --layers"));
    }
    absl::StatusOr<int64_t> layers = args->GetInt("layers");
    if (!layers.ok()) return ReportError("synth", layers.status());
    absl::Status st = WriteEarlyExitDraft(args->Get("early-exit-of"), *layers, out, report);
    progress.Done();
    if (!st.ok()) return ReportError("synth", st);
    std::cerr << "wrote early-exit draft (" << *layers << " layers) to " << out.string() << "\n";
    return 0;
  }

  absl::StatusOr<ModelConfig> config = ShapePreset(args->Get("shape"));
  if (!config.ok()) return ReportError("synth", config.status());
  SynthSpec spec;
  spec.config = *config;
  const std::string dtype = args->Get("dtype");
  if (dtype == "f32") {
    spec.dtype = kernels::DType::kF32;
  } else if (dtype == "bf16") {
    spec.dtype = kernels::DType::kBF16;
  } else if (dtype == "f16") {
    spec.dtype = kernels::DType::kF16;
  } else {
    return ReportError("synth", absl::InvalidArgumentError("--dtype must be f32, bf16 or f16"));
  }
  for (const char* name : {"seed", "shards", "vocab", "layers"}) {
    if (!args->Has(name)) continue;
    absl::StatusOr<int64_t> v = args->GetInt(name);
    if (!v.ok()) return ReportError("synth", v.status());
    if (std::string_view(name) == "seed") spec.seed = static_cast<uint64_t>(*v);
    if (std::string_view(name) == "shards") spec.num_shards = static_cast<int>(*v);
    if (std::string_view(name) == "vocab") spec.config.vocab_size = *v;
    if (std::string_view(name) == "layers") spec.config.num_layers = *v;
  }
  absl::StatusOr<double> scale = args->GetDouble("residual-scale");
  if (!scale.ok()) return ReportError("synth", scale.status());
  spec.residual_scale = *scale;
  if (args->GetBool("tied")) spec.config.tie_word_embeddings = true;
  absl::Status st = WriteSyntheticModel(spec, out, report);
  progress.Done();
  if (!st.ok()) return ReportError("synth", st);
  std::cerr << "wrote synthetic " << args->Get("shape") << " model to " << out.string() << "\n";
  return 0;
}

const CommandRegistration kRegistration({"synth", kSummary, RunSynth});

}  // namespace
}  // namespace specd::cli
