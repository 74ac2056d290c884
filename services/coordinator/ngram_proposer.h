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

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_NGRAM_PROPOSER_H_
