// Debian's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which absl::StrCat and friends take; std::string_view does not convert to it implicitly.
#ifndef SPECD_BASE_ABSL_STRING_H_
#define SPECD_BASE_ABSL_STRING_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace specd {

inline absl::string_view ToAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace specd

#endif  // SPECD_BASE_ABSL_STRING_H_
