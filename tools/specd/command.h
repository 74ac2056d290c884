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
#include "base/flags.h"

namespace specd::cli {

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
std::optional<Flags> ParseOrExit(std::string_view command, std::string_view summary,
                                 const std::vector<std::string>& argv,
                                 const std::vector<FlagSpec>& flags, int* exit_code);

// Prints `status` as "specd <command>: <message>" on stderr and returns exit code 1 (2 for
// INVALID_ARGUMENT, i.e. usage errors).
int ReportError(std::string_view command, const absl::Status& status);

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_COMMAND_H_
