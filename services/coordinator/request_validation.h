// Checks a public GenerateRequest and turns it into the scheduler's GenerationRequest. Every
// rejection is INVALID_ARGUMENT with a message that names the field and the allowed range.
#ifndef SPECD_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
#define SPECD_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "services/coordinator/scheduler.h"
#include "specd/v1/generation.pb.h"

namespace specd {

struct ServerLimits {
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  int64_t default_max_new_tokens = 256;
  int32_t default_num_speculative_tokens = 4;
  int32_t max_num_speculative_tokens = 16;
  int64_t max_prompt_bytes = 1 << 20;
  // The operator's caps (--max-prompt-tokens, --max-new-tokens-limit); 0 = only max_seq_len.
  int64_t max_prompt_tokens = 0;
  int64_t max_new_tokens_limit = 0;
  int64_t max_stop_strings = 16;
  int64_t max_stop_string_bytes = 256;
  bool has_draft = true;  // a draft worker serves DRAFT_METHOD_MODEL
  // What DRAFT_METHOD_UNSPECIFIED means (--draft-method): kModel needs a draft worker; without
  // one and with kModel, K is always 0.
  DraftMethod default_draft_method = DraftMethod::kModel;
  bool default_egag = false;  // what an unset speculation.egag means (--egag)
};

// `tokenizer` may be null for token-id-only models; then a text prompt is INVALID_ARGUMENT.
// `random_seed` is used when the request has no seed.
absl::StatusOr<GenerationRequest> BuildGenerationRequest(const v1::GenerateRequest& request,
                                                         const Tokenizer* tokenizer,
                                                         const ServerLimits& limits,
                                                         uint64_t random_seed);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
