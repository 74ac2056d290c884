#include "services/common/flags.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args,
                                   const std::vector<FlagSpec>& specs) {
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (flags are --name value)"));
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const auto spec =
        std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end())
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    flags.values_[name] = value;
  }
  for (const FlagSpec& s : specs) {
    if (flags.values_.contains(s.name)) continue;
    if (s.required) return absl::InvalidArgumentError(absl::StrCat("--", s.name, " is required"));
    flags.values_[s.name] = s.default_value;
  }
  return flags;
}

std::string Flags::Get(std::string_view name) const {
  const auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second;
}

absl::StatusOr<int64_t> Flags::GetInt(std::string_view name, int64_t min, int64_t max) const {
  const std::string text = Get(name);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be an integer, got '", text, "'"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be in [", min, ", ", max, "], got ", value));
  }
  return value;
}

absl::StatusOr<double> Flags::GetDouble(std::string_view name) const {
  const std::string text = Get(name);
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be a number, got '", text, "'"));
  }
  return value;
}

std::string Flags::Usage(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    absl::StrAppend(&out, "  --", s.name, " VALUE\n      ", s.help);
    if (s.required) absl::StrAppend(&out, " (required)");
    if (!s.default_value.empty()) absl::StrAppend(&out, " (default: ", s.default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace specd
