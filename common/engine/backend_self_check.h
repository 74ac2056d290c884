// A start-up self-check of a back end that is not the CPU, against the CPU back end, before an
// engine serves from it. A GPU back end is only as exact as its kernels on that device, driver
// and build; a broken kernel there would silently change what specd generates, the worst bug it
// could ship. So before a model is served on such a back end, a small synthetic model shaped
// like it (same weight and KV dtypes, head size, GQA group, RoPE and KV block size; two layers,
// a 256-token vocabulary) runs on both back ends, and the back end must show:
//   - row invariance, bit for bit: a prompt's logits do not change with how it is chunked, what
//     else is in the batch, whether a step is a recorded (CUDA graph) replay, or whether its
//     tokens come as a draft tree;
//   - the CPU's logits within a tolerance, and the CPU's greedy choices up to near-ties;
//   - on the CPU's logits: the CPU's processed distribution (guided rows included) and logprobs
//     within a tolerance, the CPU's argmax, and draws that are exactly the inverse CDF of its own
//     rows at the Philox uniforms.
// The conformance suite (tests/kernels/conformance) tests each op thoroughly; this runs the
// engine's own code paths once, in milliseconds, where the model is about to be served.
#ifndef SPECD_COMMON_ENGINE_BACKEND_SELF_CHECK_H_
#define SPECD_COMMON_ENGINE_BACKEND_SELF_CHECK_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/llama_engine.h"
#include "common/model/config.h"
#include "kernels/backend.h"

namespace specd {

using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<kernels::Backend>>()>;

// Whether engines on `backend` run the check first: it computes on a device (it has no host
// threads). The CPU is the check's reference.
bool NeedsSelfCheck(const kernels::Backend& backend);

// The synthetic model's config for a served model's.
ModelConfig SelfCheckConfig(const ModelConfig& served);

// Runs the check on a back end `make` returns (the check's engines free all their memory before
// this returns), for a model of `served` config with `served_options`' KV dtype, block size and
// recording.
// FAILED_PRECONDITION naming the back end and the property it broke, with numbers. An error that
// stops the check from running (no temporary directory, out of memory, a failed kernel launch)
// keeps its own code, its message saying it came from the check.
absl::Status SelfCheckBackend(const BackendFactory& make, const ModelConfig& served,
                              const EngineOptions& served_options);

}  // namespace specd

#endif  // SPECD_COMMON_ENGINE_BACKEND_SELF_CHECK_H_
