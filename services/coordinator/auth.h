// Bearer-token authentication of the public APIs (gRPC Generation and the HTTP API): one shared
// secret, read from a file (so it never shows in `ps`) or from $SPECD_AUTH_TOKEN, which every
// Generation call sends as the metadata "authorization: Bearer <token>". Checked in the handlers
// rather than in a gRPC AuthMetadataProcessor because that only runs over TLS, and the health and
// reflection services stay open: load balancers and container health checks probe health without
// credentials, and reflection only describes the public proto.
#ifndef SPECD_SERVICES_COORDINATOR_AUTH_H_
#define SPECD_SERVICES_COORDINATOR_AUTH_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace specd {

// True when `a` equals `b`, in a time that depends only on the length of `a` (the value the
// caller presented), never on where the two differ, so response times leak nothing of `b`.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class BearerTokenAuth {
 public:
  // Too short a secret can be guessed; `openssl rand -hex 32` makes a good one.
  static constexpr size_t kMinTokenLength = 16;
  static constexpr size_t kMaxTokenLength = 4096;

  // No token: every call passes.
  BearerTokenAuth() = default;

  // The token in `token_file` (surrounding whitespace ignored) when it is not empty, else
  // `env_token` (the value of $SPECD_AUTH_TOKEN, null when unset); no token when neither is set.
  // Both set is an error, so an operator never wonders which one is in force.
  static absl::StatusOr<BearerTokenAuth> Load(const std::string& token_file, const char* env_token);

  bool enabled() const { return !token_.empty(); }

  // OK, or UNAUTHENTICATED saying what is wrong with the call's credentials (never what the
  // token is).
  grpc::Status Check(const grpc::ServerContextBase& context) const;
  // The same for the value of an "authorization" header or metadata entry (null: none sent);
  // the HTTP API checks its requests with it.
  absl::Status CheckAuthorization(std::optional<absl::string_view> authorization) const;

 private:
  std::string token_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_AUTH_H_
