// Small string helpers for the tokenizer (ToAbsl for Debian's separate absl::string_view is in
// base/absl_string.h).
#ifndef SPECD_COMMON_TOKENIZER_STRING_UTIL_H_
#define SPECD_COMMON_TOKENIZER_STRING_UTIL_H_

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "base/absl_string.h"

namespace specd::tokenizer {

// Every non-overlapping occurrence of `from` (non-empty), left to right, becomes `to`.
inline std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_STRING_UTIL_H_
