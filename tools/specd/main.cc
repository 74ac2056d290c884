// specd: the command-line entry point. Every subcommand lives in its own file (see command.h).
#include <iostream>
#include <string>
#include <vector>

#include "tools/specd/command.h"

int main(int argc, char** argv) {
  const auto& table = specd::cli::CommandTable();
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd.empty() || cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << "usage: specd COMMAND [flags]   (specd COMMAND --help for its flags)\n\n";
    for (const auto& [name, command] : table) {
      std::cout << "  " << name << std::string(name.size() < 12 ? 12 - name.size() : 1, ' ')
                << command.summary << "\n";
    }
    return cmd.empty() ? 2 : 0;
  }
  const auto it = table.find(cmd);
  if (it == table.end()) {
    std::cerr << "specd: unknown command '" << cmd << "' (try specd --help)\n";
    return 2;
  }
  return it->second.run(std::vector<std::string>(argv + 2, argv + argc));
}
