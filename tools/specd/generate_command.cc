// `specd generate`: in-process generation with the engine (plain decoding, K = 0). Streams text to
// stdout and prints throughput on stderr.
#include <chrono>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/engine/decode_loop.h"
#include "common/engine/llama_engine.h"
#include "common/tokenizer/text_output.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "tools/specd/command.h"
#include "tools/specd/progress.h"
#include "tools/specd/remote_generate.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] =
    "Generate text: from a running server (speculative), or in-process from a model directory\n"
    "(plain decoding).\n"
    "  specd generate --server 127.0.0.1:50051 --prompt \"Once upon a time\" --k 4\n"
    "  specd generate --model DIR --prompt \"Once upon a time\" --max-tokens 64";

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt-ids: '", part, "' is not an id"));
    }
    ids.push_back(id);
  }
  return ids;
}

int RunClient(const Flags& args) {
  auto fail = [](const absl::Status& st) { return ReportError("generate", st); };
  v1::GenerateRequest req;
  if (args.Has("prompt-ids")) {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIds(args.Get("prompt-ids"));
    if (!ids.ok()) return fail(ids.status());
    req.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  } else {
    req.set_text(args.Get("prompt"));
  }
  if (absl::Status st = ApplyRequestFlags(args, &req); !st.ok()) return fail(st);
  absl::StatusOr<double> timeout = args.GetDouble("timeout");
  if (!timeout.ok()) return fail(timeout.status());
  return RemoteGenerate(args.Get("server"), ClientSecurityFromArgs(args), req, *timeout,
                        args.Has("prompt") ? args.Get("prompt") : "");
}

int RunGenerate(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = {
      {"server", "address of a running `specd serve` (client mode)", ""},
      {"model", "model directory (Hugging Face format), for in-process generation", ""},
      {"k", "client mode: num_speculative_tokens (default: the server's)", ""},
      {"draft-greedy", "client mode: the draft proposes its argmax", "", true},
      {"stop", "client mode: a stop string", ""},
      {"timeout", "client mode: seconds before the call is abandoned", "600"},
      {"prompt", "prompt text (needs the model's tokenizer.json)", ""},
      {"prompt-ids", "prompt as token ids, comma-separated (BOS is not added)", ""},
      {"max-tokens", "tokens to generate", "64"},
      {"temperature", "0 = greedy", "0"},
      {"top-k", "0 = off", "0"},
      {"top-p", "nucleus mass in (0, 1]", "1"},
      {"min-p", "min-p filter in [0, 1]", "0"},
      {"seed", "sampling seed (client mode: unset lets the server pick)", ""},
      {"backend", "compute back end for --model: cpu, cuda or auto", "auto"},
      {"threads", "CPU threads (0 = all cores)", "0"},
      {"kv-tokens", "KV cache capacity in tokens", "4096"},
      {"exit-layer", "run only the first L layers (early-exit draft)", "0"},
      {"ignore-eos", "do not stop at the model's EOS tokens", "", true},
  };
  for (FlagSpec& f : ClientSecurityFlags(/*with_token=*/true)) {
    f.help = "client mode: " + f.help;
    flags.push_back(std::move(f));
  }
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("generate", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  auto fail = [](const absl::Status& st) { return ReportError("generate", st); };

  if (args->Has("server") == args->Has("model")) {
    return fail(absl::InvalidArgumentError("give exactly one of --server and --model"));
  }
  if (args->Has("server")) return RunClient(*args);

  DecodeRequest req;
  int64_t threads = 0, kv_tokens = 0, exit_layer = 0, top_k = 0, seed = 0;
  double temperature = 0, top_p = 1, min_p = 0;
  for (auto [name, dst] : {std::pair<const char*, int64_t*>{"max-tokens", &req.max_new_tokens},
                           {"threads", &threads},
                           {"kv-tokens", &kv_tokens},
                           {"exit-layer", &exit_layer},
                           {"top-k", &top_k}}) {
    absl::StatusOr<int64_t> v = args->GetInt(name);
    if (!v.ok()) return fail(v.status());
    *dst = *v;
  }
  for (auto [name, dst] : {std::pair<const char*, double*>{"temperature", &temperature},
                           {"top-p", &top_p},
                           {"min-p", &min_p}}) {
    absl::StatusOr<double> v = args->GetDouble(name);
    if (!v.ok()) return fail(v.status());
    *dst = *v;
  }
  req.sampling.temperature = static_cast<float>(temperature);
  req.sampling.top_k = static_cast<int32_t>(top_k);
  req.sampling.top_p = static_cast<float>(top_p);
  req.sampling.min_p = static_cast<float>(min_p);
  if (args->Has("seed")) {
    absl::StatusOr<int64_t> v = args->GetInt("seed");
    if (!v.ok()) return fail(v.status());
    seed = *v;
  }
  req.seed = static_cast<uint64_t>(seed);

  const std::filesystem::path dir = args->Get("model");
  std::unique_ptr<Tokenizer> tokenizer;
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir);
    if (!tok.ok()) return fail(tok.status());
    tokenizer = *std::move(tok);
  }
  if (args->Has("prompt-ids")) {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIds(args->Get("prompt-ids"));
    if (!ids.ok()) return fail(ids.status());
    req.prompt = *std::move(ids);
  } else {
    if (tokenizer == nullptr) {
      return fail(absl::FailedPreconditionError(
          "the model has no tokenizer.json; pass --prompt-ids instead of --prompt"));
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(args->Get("prompt"));
    if (!ids.ok()) return fail(ids.status());
    req.prompt = *std::move(ids);
  }
  if (!args->GetBool("ignore-eos") && tokenizer != nullptr)
    req.stop_token_ids = tokenizer->eos_ids();

  Progress load_progress("loading " + dir.filename().string());
  LoadOptions load;
  load.exit_layer = exit_layer;
  load.progress = [&load_progress](int64_t done, int64_t total) {
    load_progress.Update(done, total, "tensors");
  };
  kernels::BackendOptions backend;
  absl::StatusOr<kernels::BackendKind> kind = kernels::ParseBackendKind(args->Get("backend"));
  if (!kind.ok()) return fail(kind.status());
  backend.kind = *kind;
  backend.num_threads = static_cast<int>(threads);
  EngineOptions options;
  options.kv_capacity_tokens = kv_tokens;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateEngine(dir, backend, options, load);
  load_progress.Done();
  if (!engine.ok()) return fail(engine.status());

  // The served path's text: the prompt primes the detokenizer, so the first generated word keeps
  // its leading space.
  std::optional<TextOutput> text_out;
  if (tokenizer != nullptr) {
    text_out.emplace(tokenizer.get(), std::vector<std::string>(), req.prompt);
    std::cout << args->Get("prompt") << std::flush;
  }
  auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first_token;
  absl::Status stream_status;
  auto on_token = [&](int32_t id) {
    if (first_token == std::chrono::steady_clock::time_point()) {
      first_token = std::chrono::steady_clock::now();
    }
    if (!text_out) {
      std::cout << id << " " << std::flush;
      return;
    }
    absl::StatusOr<TextOutput::Chunk> chunk = text_out->Push(std::span<const int32_t>(&id, 1));
    if (!chunk.ok()) {
      stream_status = chunk.status();
      return;
    }
    std::cout << chunk->text << std::flush;
  };
  absl::StatusOr<DecodeResult> result = DecodePlain(**engine, 0, req, on_token);
  const auto end = std::chrono::steady_clock::now();
  if (!result.ok()) return fail(result.status());
  if (text_out) {
    absl::StatusOr<std::string> tail = text_out->Finish();
    if (tail.ok()) std::cout << *tail;
  }
  std::cout << std::endl;
  if (!stream_status.ok()) return fail(stream_status);
  const double decode = std::chrono::duration<double>(end - first_token).count();
  const size_t n = result->tokens.size();
  std::fprintf(stderr,
               "[%zu prompt tokens, %zu generated%s; time to first token %.1f ms; decode %.1f "
               "tokens/s]\n",
               req.prompt.size(), n, result->stopped_by_token ? ", stopped at EOS" : "",
               1e3 * std::chrono::duration<double>(first_token - start).count(),
               n > 1 ? static_cast<double>(n - 1) / decode : 0.0);
  return 0;
}

const CommandRegistration kRegistration({"generate", kSummary, RunGenerate});

}  // namespace
}  // namespace specd::cli
