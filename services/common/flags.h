// A small command-line parser for the service binaries: `--name value`, `--name=value`, checked
// against the flags a binary declares. No global flag registry, so binaries and tests link
// together freely.
#ifndef SPECD_SERVICES_COMMON_FLAGS_H_
#define SPECD_SERVICES_COMMON_FLAGS_H_

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
  std::string default_value;
  bool required = false;
};

class Flags {
 public:
  // INVALID_ARGUMENT naming the flag for unknown flags, missing values, positional arguments and
  // missing required flags. `args` excludes the program name.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::vector<FlagSpec>& specs);

  // "" for a flag without a value or default.
  std::string Get(std::string_view name) const;
  // INVALID_ARGUMENT naming the flag unless its value is an integer in [min, max].
  absl::StatusOr<int64_t> GetInt(std::string_view name, int64_t min, int64_t max) const;
  // INVALID_ARGUMENT naming the flag unless its value is a finite number.
  absl::StatusOr<double> GetDouble(std::string_view name) const;

  static std::string Usage(const std::vector<FlagSpec>& specs);

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_FLAGS_H_
