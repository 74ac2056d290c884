// The client half of `specd generate --server ADDR`: one streamed Generate call, over TLS and with
// a bearer token when the server asks for them.
#ifndef SPECD_TOOLS_SPECD_REMOTE_GENERATE_H_
#define SPECD_TOOLS_SPECD_REMOTE_GENERATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "specd/v1/generation.grpc.pb.h"
#include "specd/v1/generation.pb.h"
#include "tools/specd/command.h"

namespace specd::cli {

// How the CLI reaches a secured server.
struct ClientSecurity {
  std::string tls_ca_file;  // TLS trusting these CA certificates; empty = plaintext
  std::string token;        // sent as "authorization: Bearer <token>"; empty = none
};

// --tls-ca, and --token when `with_token` (health is unauthenticated, so it needs no token).
std::vector<FlagSpec> ClientSecurityFlags(bool with_token);

// From the flags above; the token falls back to $SPECD_TOKEN, which keeps it out of `ps`.
ClientSecurity ClientSecurityFromArgs(const Flags& args);

// A channel to `server` with TLS when `security` has a CA file; INVALID_ARGUMENT or NOT_FOUND
// naming --tls-ca when that file is not a readable PEM certificate.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& server,
                                                           const ClientSecurity& security);

// Waits for `channel` to `server` to connect. A person at the keyboard should hear why nothing
// happens (the server may be loading its model, or the address may be wrong): after 3 s this says
// so on stderr as `program`. UNAVAILABLE naming the address and the flag when it has not
// connected within `timeout_seconds`.
absl::Status AwaitServer(grpc::Channel& channel, const std::string& server,
                         const std::string& program, double timeout_seconds);

// The client-mode request flags both `generate --server` and `chat` take, into `request`:
// --max-tokens, --temperature, --top-k, --top-p, --min-p, --seed, --k, --draft-greedy, --stop and
// --ignore-eos. INVALID_ARGUMENT naming the flag when one does not parse or is out of range.
absl::Status ApplyRequestFlags(const Flags& args, v1::GenerateRequest* request);

// One Generate call whose text was streamed to stdout as it came.
struct StreamedReply {
  std::string text;
  v1::Usage usage;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  double time_to_first_token_ms = 0;
  double tokens_per_second = 0;  // after the first token
};
// Streams `request`'s text to stdout; the server's error, with its message, when the call fails.
absl::StatusOr<StreamedReply> StreamToStdout(v1::Generation::Stub& stub,
                                             const ClientSecurity& security,
                                             const v1::GenerateRequest& request,
                                             double timeout_seconds);

// Streams the text to stdout, after `echo` (the prompt, as the CLI prints it) once the server
// is reached, and a summary (acceptance rate, tokens/s) to stderr. Returns the process exit code.
int RemoteGenerate(const std::string& server, const ClientSecurity& security,
                   const v1::GenerateRequest& request, double timeout_seconds,
                   const std::string& echo);

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_REMOTE_GENERATE_H_
