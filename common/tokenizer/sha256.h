// SHA-256 for the tokenizer fingerprint: stable across processes, builds and machines, which
// std::hash and absl::Hash are not. OpenSSL's libcrypto computes it (gRPC links it already).
#ifndef SPECD_COMMON_TOKENIZER_SHA256_H_
#define SPECD_COMMON_TOKENIZER_SHA256_H_

#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;

namespace specd::tokenizer {

class Sha256 {
 public:
  Sha256();
  void Update(std::string_view data);
  // Lowercase hex of the digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  struct CtxDeleter {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> ctx_;
};

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_SHA256_H_
