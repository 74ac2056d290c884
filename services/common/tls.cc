#include "services/common/tls.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace specd {
namespace {

// Certificates and keys are small; a bigger file is a wrong path (say, a model file).
constexpr int64_t kMaxPemFileBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* flag,
                                        const char* label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (static_cast<int64_t>(pem.size()) > kMaxPemFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' is ", pem.size(), " bytes, too big for a PEM file"));
  }
  const size_t begin = pem.find("-----BEGIN ");
  const size_t end = begin == std::string::npos ? begin : pem.find("-----", begin + 11);
  if (end == std::string::npos || !std::string_view(pem).substr(0, end).ends_with(label)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is not a PEM file with a ",
                                                   label, " (no '-----BEGIN ... ", label,
                                                   "-----' line)"));
  }
  if (std::string_view(pem).substr(begin, end - begin).find("ENCRYPTED") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path,
                     "' is encrypted; gRPC needs an unencrypted key (openssl pkey -in KEY -out "
                     "PLAIN_KEY), readable only by the server's user"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  SPECD_ASSIGN_OR_RETURN(std::string cert, ReadPemFile(cert_file, "--tls-cert", "CERTIFICATE"));
  SPECD_ASSIGN_OR_RETURN(std::string key, ReadPemFile(key_file, "--tls-key", "PRIVATE KEY"));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  SPECD_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(ca_file, "--tls-ca", "CERTIFICATE"));
  return grpc::SslCredentials(options);
}

}  // namespace specd
