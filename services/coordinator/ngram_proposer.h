// Prompt-lookup drafting (Saxena 2023, "Prompt Lookup Decoding"; vLLM's and llama.cpp's n-gram
// speculation): the coordinator proposes the drafts itself, with no draft model. It finds the
// latest earlier occurrence of the text's last n tokens, for n from max_n down to min_n, and
// proposes the tokens that followed it. The proposal is a deterministic function of the committed
// tokens, so its q is one-hot (see tree_accept.h for how such drafts are verified).
#ifndef SPECD_SERVICES_COORDINATOR_NGRAM_PROPOSER_H_
#define SPECD_SERVICES_COORDINATOR_NGRAM_PROPOSER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace specd {

struct NgramOptions {
  int32_t min_n = 1;
  int32_t max_n = 4;
};

// INVALID_ARGUMENT naming the flag when 1 <= min_n <= max_n <= 64 does not hold.
absl::Status ValidateNgramOptions(const NgramOptions& options);

// Up to `k` tokens continuing `text`: for the longest n in [min_n, max_n] whose last-n-token
// suffix occurs earlier in `text`, the tokens after its latest earlier occurrence (which may run
// into the suffix itself). Empty when nothing matches or k <= 0.
std::vector<int32_t> ProposeNgram(std::span<const int32_t> text, int32_t k,
                                  const NgramOptions& options);

// Up to `k` tokens continuing `output` (the tokens generated so far) from `prediction`, the
// output the client expects (OpenAI's predicted outputs). Before anything is generated, the
// prediction's first tokens. Then, for the longest n in [min_n, max_n] whose last-n-token suffix
// of `output` occurs in the prediction with a token after it, the tokens after the occurrence
// that ends nearest to where `output` ends (the earliest of equals): an edit shifts the rest of
// the prediction by a few tokens, and a repeated line must not send the lookup back to its first
// copy. Empty when nothing matches or k <= 0. A deterministic function of the committed tokens,
// so its q is one-hot, as ProposeNgram's.
std::vector<int32_t> ProposeFromPrediction(std::span<const int32_t> output,
                                           std::span<const int32_t> prediction, int32_t k,
                                           const NgramOptions& options);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_NGRAM_PROPOSER_H_
