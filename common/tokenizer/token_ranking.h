// Which tokens a draft's reduced classifier keeps (FR-Spec, Zhao et al. 2025): the N most
// frequent, by a measured token-frequency file or, without one, by the tokenizer's own ranking
// (BPE merge ranks, or Unigram scores). `specd token-freq` writes the file from a target's own
// generations on a prompt set.
#ifndef SPECD_COMMON_TOKENIZER_TOKEN_RANKING_H_
#define SPECD_COMMON_TOKENIZER_TOKEN_RANKING_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

// Every token id of the vocabulary, most frequent first as the tokenizer ranks them: special and
// added tokens, then the pieces no merge produces (bytes, characters) in id order, then merged
// pieces by merge rank; for a Unigram model, by score (higher first). `dir` holds
// tokenizer.json; ids the tokenizer does not name follow in id order, up to `vocab_size`.
absl::StatusOr<std::vector<int32_t>> TokenizerRanking(const std::filesystem::path& dir,
                                                      int64_t vocab_size);

// A token-frequency file: one "TOKEN_ID<TAB>COUNT" line per token, '#' lines are comments.
// Returns counts for ids [0, vocab_size); INVALID_ARGUMENT naming the line for anything else.
absl::StatusOr<std::vector<int64_t>> ReadTokenCounts(const std::filesystem::path& path,
                                                     int64_t vocab_size);
// Writes `counts` (indexed by id) in that format, most frequent first, zero counts left out.
absl::Status WriteTokenCounts(const std::filesystem::path& path, const std::vector<int64_t>& counts,
                              const std::string& comment);

// The `n` token ids to keep, ascending: by count (ties and tokens never counted by the
// tokenizer's ranking) when `counts_file` is set, else by the tokenizer's ranking alone.
absl::StatusOr<std::vector<int32_t>> SelectOutputVocab(const std::filesystem::path& model_dir,
                                                       int64_t vocab_size, int64_t n,
                                                       const std::filesystem::path& counts_file);

}  // namespace specd

#endif  // SPECD_COMMON_TOKENIZER_TOKEN_RANKING_H_
