#include "base/flags.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args,
                                   const std::vector<FlagSpec>& specs, bool allow_positional) {
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "--")) {
      if (!allow_positional) {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected argument '", arg, "' (flags are --name value)"));
      }
      flags.positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const auto spec =
        std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (spec->is_bool) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes true or false, got '", value, "'"));
      }
      flags.values_[name] = has_value ? value : "true";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size() || absl::StartsWith(args[i + 1], "--")) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    flags.values_[name] = std::move(value);
  }
  for (const FlagSpec& s : specs) {
    if (flags.values_.contains(s.name)) continue;
    if (s.required) return absl::InvalidArgumentError(absl::StrCat("--", s.name, " is required"));
    if (!s.default_value.empty()) flags.values_[s.name] = s.default_value;
  }
  return flags;
}

bool Flags::Has(std::string_view name) const { return values_.find(name) != values_.end(); }

std::string Flags::Get(std::string_view name) const {
  const auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second;
}

absl::StatusOr<int64_t> Flags::GetInt(std::string_view name) const {
  return GetInt(name, INT64_MIN, INT64_MAX);
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
  return GetDouble(name, -HUGE_VAL, HUGE_VAL);
}

absl::StatusOr<double> Flags::GetDouble(std::string_view name, double min, double max) const {
  const std::string text = Get(name);
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be a number, got '", text, "'"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be in [", min, ", ", max, "], got ", value));
  }
  return value;
}

bool Flags::GetBool(std::string_view name) const { return Get(name) == "true"; }

absl::StatusOr<bool> Flags::GetOnOff(std::string_view name) const {
  const std::string text = Get(name);
  if (text != "on" && text != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be on or off, got '", text, "'"));
  }
  return text == "on";
}

std::string Flags::Usage(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    absl::StrAppend(&out, "  --", s.name, s.is_bool ? "" : " VALUE", "\n      ", s.help);
    if (s.required) absl::StrAppend(&out, " (required)");
    if (!s.default_value.empty()) absl::StrAppend(&out, " (default: ", s.default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace specd
