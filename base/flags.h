// The one command-line parser of specd's binaries: the service mains and every `specd` command.
// `--name value`, `--name=value` and bare `--name` for boolean flags, checked against the flags
// a binary declares. No global flag registry, so binaries and tests link together freely.
#ifndef SPECD_BASE_FLAGS_H_
#define SPECD_BASE_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

struct FlagSpec {
  std::string name;  // without the leading "--"
  std::string help;
  std::string default_value;  // "" = unset unless given
  bool is_bool = false;       // `--name` alone means true; `--name=true|false` also parse
  bool required = false;
};

class Flags {
 public:
  // INVALID_ARGUMENT naming the flag for unknown flags, missing values, missing required flags
  // and, unless `allow_positional`, positional arguments. `args` excludes the program (and
  // command) name. A value that itself starts with "--" must be given as --name=--value, so a
  // forgotten value ("--server --prompt x") is an error rather than a server named "--prompt".
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::vector<FlagSpec>& specs,
                                     bool allow_positional = false);

  // Whether the flag was given or has a non-empty default.
  bool Has(std::string_view name) const;
  // "" for a flag that was not given and has no default.
  std::string Get(std::string_view name) const;
  // INVALID_ARGUMENT naming the flag unless its value is an integer (in [min, max]).
  absl::StatusOr<int64_t> GetInt(std::string_view name) const;
  absl::StatusOr<int64_t> GetInt(std::string_view name, int64_t min, int64_t max) const;
  // INVALID_ARGUMENT naming the flag unless its value is a number (in [min, max]).
  absl::StatusOr<double> GetDouble(std::string_view name) const;
  absl::StatusOr<double> GetDouble(std::string_view name, double min, double max) const;
  bool GetBool(std::string_view name) const;
  // A switch given as on or off; INVALID_ARGUMENT naming the flag for anything else.
  absl::StatusOr<bool> GetOnOff(std::string_view name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  static std::string Usage(const std::vector<FlagSpec>& specs);

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_;
};

}  // namespace specd

#endif  // SPECD_BASE_FLAGS_H_
