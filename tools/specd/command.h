// Subcommands of the `specd` binary. Each lives in its own file and registers itself with a
// static `CommandRegistration`, so adding a command never touches main.cc.
#ifndef SPECD_TOOLS_SPECD_COMMAND_H_
#define SPECD_TOOLS_SPECD_COMMAND_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd::cli {

// Parsed `--name value` / `--name=value` / `--flag` arguments, checked against the flags a
// command declares.
class Args {
 public:
  struct Flag {
    std::string name;  // without the leading "--"
    std::string help;
    std::string default_value;  // "" means required unless is_bool
    bool is_bool = false;
    bool required = false;
  };

  // INVALID_ARGUMENT for unknown flags, missing values and missing required flags.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<Flag>& flags);

  bool Has(std::string_view name) const;
  std::string Get(std::string_view name) const;
  absl::StatusOr<int64_t> GetInt(std::string_view name) const;
  absl::StatusOr<double> GetDouble(std::string_view name) const;
  bool GetBool(std::string_view name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  static std::string Usage(const std::vector<Flag>& flags);

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_;
};

struct Command {
  std::string name;
  std::string summary;
  // argv excludes the program and command names. Returns the process exit code.
  std::function<int(const std::vector<std::string>& argv)> run;
};

std::map<std::string, Command>& CommandTable();

struct CommandRegistration {
  explicit CommandRegistration(Command command);
};

// Parses argv for `command`; on --help prints usage and returns exit code 0 in `*exit_code`, on a
// parse error prints it with the usage and sets exit code 2. Returns the args when the command
// should run.
std::optional<Args> ParseOrExit(std::string_view command, std::string_view summary,
                                const std::vector<std::string>& argv,
                                const std::vector<Args::Flag>& flags, int* exit_code);

// Prints `status` as "specd <command>: <message>" on stderr and returns exit code 1 (2 for
// INVALID_ARGUMENT, i.e. usage errors).
int ReportError(std::string_view command, const absl::Status& status);

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_COMMAND_H_
