// `specd tokenize` and `specd detokenize`: the model directory's tokenizer on the command line.
#include <cstdint>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/specd/command.h"

namespace specd::cli {
namespace {

constexpr char kTokenizeSummary[] =
    "Print the token ids of a text (--text, or all of stdin verbatim) with the model's tokenizer.";
constexpr char kDetokenizeSummary[] =
    "Print the text of token ids (arguments, or whitespace/comma separated on stdin), then a "
    "newline.";

std::string ReadStdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

int RunTokenize(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"model", "model directory with tokenizer.json", "", false, true},
      {"text", "text to tokenize; stdin is read when absent", ""},
      {"parse-special", "recognise special tokens such as <|eot_id|> written in the text", "",
       true},
      {"add-bos", "true or false; default: what tokenizer_config.json says", ""},
      {"continuation",
       "the text continues earlier text, as a predicted output does: no dummy prefix at its start "
       "(and no BOS unless --add-bos true)",
       "", true},
      {"format", "ids (one line), json (array of ids) or pieces (id and piece per line)", "ids"},
  };
  int exit_code = 0;
  const std::optional<Flags> args =
      ParseOrExit("tokenize", kTokenizeSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  if (!args->positional().empty()) {
    return ReportError("tokenize", absl::InvalidArgumentError(
                                       absl::StrCat("unexpected argument '", args->positional()[0],
                                                    "' (pass the text with --text or on stdin)")));
  }
  const std::string format = args->Get("format");
  if (format != "ids" && format != "json" && format != "pieces") {
    return ReportError(
        "tokenize", absl::InvalidArgumentError(
                        absl::StrCat("--format must be ids, json or pieces, got '", format, "'")));
  }
  EncodeOptions options;
  options.parse_special = args->GetBool("parse-special");
  options.continuation = args->GetBool("continuation");
  if (options.continuation) options.add_bos = false;
  if (args->Has("add-bos")) {
    const std::string v = args->Get("add-bos");
    if (v != "true" && v != "false") {
      return ReportError("tokenize", absl::InvalidArgumentError(absl::StrCat(
                                         "--add-bos takes true or false, got '", v, "'")));
    }
    options.add_bos = v == "true";
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(args->Get("model"));
  if (!tok.ok()) return ReportError("tokenize", tok.status());
  const std::string text = args->Has("text") ? args->Get("text") : ReadStdin();
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(text, options);
  if (!ids.ok()) return ReportError("tokenize", ids.status());
  if (format == "ids") {
    std::cout << absl::StrJoin(*ids, " ") << "\n";
  } else if (format == "json") {
    std::cout << nlohmann::json(*ids).dump() << "\n";
  } else {
    for (const int32_t id : *ids) {
      absl::StatusOr<std::string> piece = (*tok)->IdToPiece(id);
      if (!piece.ok()) return ReportError("tokenize", piece.status());
      std::cout << id << "\t" << *piece << "\n";
    }
  }
  return 0;
}

int RunDetokenize(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"model", "model directory with tokenizer.json", "", false, true},
      {"skip-special", "leave special tokens (BOS, EOS, ...) out of the text", "", true},
  };
  int exit_code = 0;
  const std::optional<Flags> args =
      ParseOrExit("detokenize", kDetokenizeSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  std::vector<std::string> words = args->positional();
  if (words.empty()) {
    for (const absl::string_view w :
         absl::StrSplit(ReadStdin(), absl::ByAnyChar(" \t\r\n,"), absl::SkipEmpty())) {
      words.emplace_back(w);
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(words.size());
  for (const std::string& w : words) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(w, &id)) {
      return ReportError("detokenize",
                         absl::InvalidArgumentError(absl::StrCat("'", w, "' is not a token id")));
    }
    ids.push_back(id);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(args->Get("model"));
  if (!tok.ok()) return ReportError("detokenize", tok.status());
  absl::StatusOr<std::string> text = (*tok)->Decode(ids, args->GetBool("skip-special"));
  if (!text.ok()) return ReportError("detokenize", text.status());
  std::cout << *text << "\n";
  return 0;
}

const CommandRegistration kTokenize({"tokenize", kTokenizeSummary, RunTokenize});
const CommandRegistration kDetokenize({"detokenize", kDetokenizeSummary, RunDetokenize});

}  // namespace
}  // namespace specd::cli
