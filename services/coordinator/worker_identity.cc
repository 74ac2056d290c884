#include "services/coordinator/worker_identity.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/protocol/worker_protocol.h"

namespace specd {
namespace {

namespace pb = worker::v1;

// `change` says what the restarted worker runs now that the old process did not.
absl::Status Refused(absl::string_view change) {
  return absl::FailedPreconditionError(
      absl::StrCat("it came back with ", change,
                   ", so the sequences it held cannot replay there; restart the coordinator to "
                   "serve what the worker runs now"));
}

absl::Status Changed(absl::string_view what, absl::string_view now, absl::string_view before) {
  return Refused(absl::StrCat(what, " ", now, " (was ", before, ")"));
}

// Long or opaque values (config.json, fingerprints) are named, not printed.
absl::Status ChangedOpaque(absl::string_view what) {
  return Refused(absl::StrCat("another ", what));
}

}  // namespace

absl::Status CheckProtocolVersion(const pb::InfoResponse& info) {
  if (info.protocol_version() == kWorkerProtocolVersion) return absl::OkStatus();
  const std::string speaks =
      info.protocol_version() == 0
          ? std::string("no worker protocol version (a release older than version 1)")
          : absl::StrCat("worker protocol ", info.protocol_version());
  return absl::FailedPreconditionError(
      absl::StrCat("it speaks ", speaks, " and this coordinator version ", kWorkerProtocolVersion,
                   "; run the coordinator and both workers from one specd release"));
}

absl::Status CheckSameComputation(const pb::InfoResponse& before, const pb::InfoResponse& now) {
  if (now.role() != before.role()) {
    return Changed("role", pb::WorkerRole_Name(now.role()), pb::WorkerRole_Name(before.role()));
  }
  // Every worker: the tokens mean the same.
  if (now.vocab_size() != before.vocab_size()) {
    return Changed("vocab_size", absl::StrCat(now.vocab_size()), absl::StrCat(before.vocab_size()));
  }
  if (now.tokenizer_fingerprint() != before.tokenizer_fingerprint()) {
    return ChangedOpaque("tokenizer");
  }
  // The coordinator admits sequences up to the max_seq_len its workers had at its start.
  if (now.max_seq_len() < before.max_seq_len()) {
    return Changed("max_seq_len", absl::StrCat(now.max_seq_len()),
                   absl::StrCat(before.max_seq_len()));
  }
  if (now.role() != pb::WORKER_ROLE_TARGET) return absl::OkStatus();
  // The target: every number it computes is the same.
  if (now.model_config_json() != before.model_config_json()) {
    return ChangedOpaque("model config (config.json, or --exit-layer)");
  }
  if (now.model_name() != before.model_name()) {
    return Changed("model", now.model_name(), before.model_name());
  }
  if (now.weights_fingerprint() != before.weights_fingerprint()) {
    return ChangedOpaque("checkpoint (other weights under the same name and config.json)");
  }
  if (now.backend() != before.backend()) {
    return Changed("back end", now.backend(), before.backend());
  }
  if (now.kv_dtype() != before.kv_dtype()) {
    return Changed("kv_dtype", now.kv_dtype(), before.kv_dtype());
  }
  if (now.output_vocab_size() != before.output_vocab_size()) {
    return Changed("output_vocab_size", absl::StrCat(now.output_vocab_size()),
                   absl::StrCat(before.output_vocab_size()));
  }
  if (!std::equal(now.eos_token_ids().begin(), now.eos_token_ids().end(),
                  before.eos_token_ids().begin(), before.eos_token_ids().end())) {
    return Changed("eos_token_ids", absl::StrJoin(now.eos_token_ids(), ","),
                   absl::StrJoin(before.eos_token_ids(), ","));
  }
  return absl::OkStatus();
}

}  // namespace specd
