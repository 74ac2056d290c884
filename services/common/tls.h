// TLS for the public API: server credentials from a PEM certificate chain and key (the
// coordinator) and channel credentials that trust one CA bundle (the CLI and tests). Workers speak
// plaintext on a private network (loopback or compose's internal one); only the public API needs
// TLS.
#ifndef SPECD_SERVICES_COMMON_TLS_H_
#define SPECD_SERVICES_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace specd {

// The whole PEM file at `path`, which must hold a "-----BEGIN <label>" block (`label` is e.g.
// "CERTIFICATE" or "PRIVATE KEY", matched as a suffix so "EC PRIVATE KEY" passes). Errors name
// `flag` and the path, never the contents.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* flag,
                                        const char* label);

// TLS server credentials for `cert_file` (the server's certificate, then any intermediates) and
// `key_file` (its private key). Clients are not asked for certificates; callers authenticate with
// a bearer token instead.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// Channel credentials: TLS trusting only the CA certificates in `ca_file`; plaintext when
// `ca_file` is empty.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const std::string& ca_file);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_TLS_H_
