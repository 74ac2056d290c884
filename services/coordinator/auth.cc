#include "services/coordinator/auth.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace specd {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (b.empty()) return a.empty();
  uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<uint8_t>(a[i]) ^ static_cast<uint8_t>(b[i % b.size()]);
  }
  return diff == 0;
}

absl::StatusOr<BearerTokenAuth> BearerTokenAuth::Load(const std::string& token_file,
                                                      const char* env_token) {
  if (!token_file.empty() && env_token != nullptr) {
    return absl::InvalidArgumentError(
        "--auth-token-file and $SPECD_AUTH_TOKEN are both set; use one");
  }
  std::string token;
  std::string source = "$SPECD_AUTH_TOKEN";
  if (!token_file.empty()) {
    source = absl::StrCat("--auth-token-file '", token_file, "'");
    std::ifstream in(token_file, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat(source, ": cannot read it: ", std::strerror(errno)));
    }
    std::ostringstream text;
    text << in.rdbuf();
    token = text.str();
  } else if (env_token != nullptr) {
    token = env_token;
  } else {
    return BearerTokenAuth();
  }
  const absl::string_view trimmed = absl::StripAsciiWhitespace(token);
  if (trimmed.size() < kMinTokenLength || trimmed.size() > kMaxTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the token has ", trimmed.size(), " characters; use ", kMinTokenLength, " to ",
        kMaxTokenLength, " (e.g. the output of `openssl rand -hex 32`)"));
  }
  // gRPC metadata values are printable ASCII; a token outside it could never be sent.
  for (const char c : trimmed) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the token may hold only printable ASCII without spaces (byte ",
                       static_cast<int>(static_cast<unsigned char>(c)), " found)"));
    }
  }
  BearerTokenAuth auth;
  auth.token_ = std::string(trimmed);
  return auth;
}

absl::Status BearerTokenAuth::CheckAuthorization(
    std::optional<absl::string_view> authorization) const {
  if (!enabled()) return absl::OkStatus();
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "this server requires a bearer token: send 'authorization: Bearer <token>'");
  }
  const absl::string_view value = *authorization;
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("the 'authorization' value must be 'Bearer <token>'");
  }
  if (!ConstantTimeEquals(absl::StripAsciiWhitespace(value.substr(kScheme.size())), token_)) {
    return absl::UnauthenticatedError("the bearer token is not valid");
  }
  return absl::OkStatus();
}

grpc::Status BearerTokenAuth::Check(const grpc::ServerContextBase& context) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  std::optional<absl::string_view> value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  const absl::Status st = CheckAuthorization(value);
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(st.message()));
}

}  // namespace specd
