// `specd convert llama2c`: imports a llama2.c checkpoint (and tokenizer) as a Hugging Face dir.
#include <iostream>

#include "common/convert/llama2c.h"
#include "tools/specd/command.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] =
    "Convert a checkpoint to the Hugging Face directory format.\n"
    "  specd convert llama2c --checkpoint X.bin [--tokenizer tok.bin] --out DIR";

int RunConvert(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"checkpoint", "llama2.c model file (.bin)", "", false, true},
      {"tokenizer", "llama2.c tokenizer file (.bin); writes tokenizer.json when given", ""},
      {"out", "output directory", "", false, true},
      {"dtype", "weight dtype to write: f32, bf16 or f16", "f32"},
  };
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("convert", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  if (args->positional().size() != 1 || args->positional()[0] != "llama2c") {
    std::cerr << "specd convert: the source format must be given: specd convert llama2c ...\n";
    return 2;
  }
  Llama2cConvertOptions options;
  options.checkpoint = args->Get("checkpoint");
  if (args->Has("tokenizer")) options.tokenizer = args->Get("tokenizer");
  options.out_dir = args->Get("out");
  const std::string dtype = args->Get("dtype");
  if (dtype == "f32") {
    options.dtype = kernels::DType::kF32;
  } else if (dtype == "bf16") {
    options.dtype = kernels::DType::kBF16;
  } else if (dtype == "f16") {
    options.dtype = kernels::DType::kF16;
  } else {
    return ReportError("convert", absl::InvalidArgumentError("--dtype must be f32, bf16 or f16"));
  }
  if (absl::Status st = ConvertLlama2c(options); !st.ok()) return ReportError("convert", st);
  std::cerr << "wrote " << options.out_dir.string() << "\n";
  return 0;
}

const CommandRegistration kRegistration({"convert", kSummary, RunConvert});

}  // namespace
}  // namespace specd::cli
