#include "tools/specd/command.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd::cli {

std::map<std::string, Command>& CommandTable() {
  static auto* table = new std::map<std::string, Command>();  // never destroyed: static init order
  return *table;
}

CommandRegistration::CommandRegistration(Command command) {
  std::string name = command.name;
  CommandTable().emplace(std::move(name), std::move(command));
}

std::optional<Flags> ParseOrExit(std::string_view command, std::string_view summary,
                                 const std::vector<std::string>& argv,
                                 const std::vector<FlagSpec>& flags, int* exit_code) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: specd " << command << " [flags]\n"
                << summary << "\n\n"
                << Flags::Usage(flags);
      *exit_code = 0;
      return std::nullopt;
    }
  }
  absl::StatusOr<Flags> args = Flags::Parse(argv, flags, /*allow_positional=*/true);
  if (!args.ok()) {
    std::cerr << "specd " << command << ": " << args.status().message() << "\n\n"
              << Flags::Usage(flags);
    *exit_code = 2;
    return std::nullopt;
  }
  return *std::move(args);
}

int ReportError(std::string_view command, const absl::Status& status) {
  std::cerr << "specd " << command << ": " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace specd::cli
