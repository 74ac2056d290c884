#include "services/coordinator/coordinator_flags.h"

namespace specd {

std::vector<FlagSpec> CoordinatorServingFlags() {
  return {
      {"draft-method",
       "who drafts when a request does not say: model (the draft worker) or ngram (prompt "
       "lookup by the coordinator, no draft worker needed)",
       "model"},
      {"ngram-min", "prompt lookup: the shortest suffix (in tokens) matched", "1"},
      {"ngram-max", "prompt lookup: the longest suffix (in tokens) matched, tried first", "4"},
      {"egag",
       "entropy-guided adaptive draft length for requests that do not say (model chains only)", "",
       true},
      {"egag-ema-beta", "EGAG: weight of the past in the per-request entropy average h", "0.5"},
      {"egag-threshold", "EGAG: stop drafting once the normalized entropy exceeds this", "0.6"},
      {"egag-min-tokens", "EGAG: drafts a round always makes (gamma_min)", "1"},
      {"default-k", "num_speculative_tokens when a request does not say", "4"},
      {"max-k", "largest num_speculative_tokens a request may ask for", "16"},
      {"num-candidates", "residual candidates M the target draws per draft position", "4"},
      {"max-running", "sequences in the running batch", "32"},
      {"max-queued", "requests waiting beyond the running batch", "256"},
      {"prefill-chunk",
       "chunked prefill: the most catch-up tokens a worker feeds per sequence and round beyond "
       "its prefix cache, so a long prompt is spread over rounds that keep decoding the running "
       "streams; 0 = each prompt in one round",
       "512"},
      {"prefix-sharing",
       "on: a prompt that shares at least 32 tokens of whole KV blocks with one another sequence "
       "is computing waits for them and takes them from the workers' prefix caches (while the "
       "target's --prefix-caching is on, as a restarted target declares it); off: each prompt "
       "computes its own copy",
       "on"},
      {"default-max-new-tokens", "max_new_tokens when a request does not say", "256"},
      {"worker-wait-seconds", "how long to wait for the workers at start-up", "120"},
      {"worker-call-timeout-seconds",
       "deadline of each call to a worker, after which it counts as hung; must exceed the "
       "longest call, a prefill chunk on the target (a whole prompt with --prefill-chunk 0)",
       "30"},
      {"worker-local-sockets",
       "on: make each round's calls over the Unix socket a worker's --local-socket names, when "
       "that worker is on this host (gRPC costs more per call); off: gRPC only",
       "on"},
      {"worker-unavailable-seconds",
       "how long a request waits for an unavailable (crashed, restarting or hung) worker before "
       "it fails with UNAVAILABLE",
       "30"},
      {"drain-seconds",
       "on SIGTERM, how long in-flight requests may take; then they end with UNAVAILABLE", "10"},
      {"tls-cert", "PEM certificate chain: serve the public API over TLS (with --tls-key)", ""},
      {"tls-key", "PEM private key of --tls-cert", ""},
      {"auth-token-file",
       "file holding the bearer token every Generation call must send (or set "
       "$SPECD_AUTH_TOKEN); unset = no token",
       ""},
      {"max-request-bytes", "largest request message accepted (RESOURCE_EXHAUSTED above)",
       "4194304"},
      {"max-prompt-tokens", "longest prompt in tokens; 0 = the model's max_seq_len", "0"},
      {"max-new-tokens-limit",
       "largest max_new_tokens a request may ask for; 0 = up to the model's max_seq_len", "0"},
      {"max-streams-per-connection",
       "Generate streams one client connection may hold open at once; 0 = no limit", "128"},
      {"prep-threads",
       "threads that validate and tokenize requests of both APIs, off the network threads that "
       "carry every other request's stream",
       "2"},
      {"served-model-name",
       "the model name of the HTTP API (requests naming another get 404); unset = the target "
       "model directory's name",
       ""},
      {"chat-template",
       "Jinja chat template file for chat requests, instead of the model's tokenizer_config.json "
       "chat_template",
       ""},
  };
}

}  // namespace specd
