#include "common/tokenizer/sha256.h"

#include <openssl/evp.h>

#include <cstdint>

#include "absl/strings/escaping.h"

namespace specd::tokenizer {

// EVP_DigestInit_ex and friends fail only when out of memory or on an unavailable algorithm;
// SHA-256 is in OpenSSL's default provider, so their results are not checked one by one: a
// failure shows as a wrong (empty) digest, which a fingerprint comparison rejects.
Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ != nullptr) EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
}

void Sha256::CtxDeleter::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

void Sha256::Update(std::string_view data) {
  if (ctx_ != nullptr) EVP_DigestUpdate(ctx_.get(), data.data(), data.size());
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (ctx_ == nullptr || EVP_DigestFinal_ex(ctx_.get(), digest, &size) != 1) return "";
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(size)));
}

}  // namespace specd::tokenizer
