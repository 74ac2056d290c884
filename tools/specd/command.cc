#include "tools/specd/command.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<Flag>& flags) {
  Args args;
  auto find = [&](std::string_view name) -> const Flag* {
    for (const Flag& f : flags) {
      if (f.name == name) return &f;
    }
    return nullptr;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (!absl::StartsWith(a, "--")) {
      args.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (flag->is_bool) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes true or false, got '", value, "'"));
      }
      args.values_[name] = has_value ? value : "true";
      continue;
    }
    if (!has_value) {
      // "--server --prompt x" is a forgotten value, not a server named "--prompt"; a value that
      // really starts with "--" can be given as --name=--value.
      if (i + 1 >= argv.size() || absl::StartsWith(argv[i + 1], "--")) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values_[name] = value;
  }
  for (const Flag& f : flags) {
    if (args.values_.contains(f.name)) continue;
    if (f.required) return absl::InvalidArgumentError(absl::StrCat("--", f.name, " is required"));
    if (!f.default_value.empty()) args.values_[f.name] = f.default_value;
  }
  return args;
}

bool Args::Has(std::string_view name) const { return values_.find(name) != values_.end(); }

std::string Args::Get(std::string_view name) const {
  const auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(std::string_view name) const {
  int64_t v = 0;
  if (!absl::SimpleAtoi(Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be an integer, got '", Get(name), "'"));
  }
  return v;
}

absl::StatusOr<double> Args::GetDouble(std::string_view name) const {
  double v = 0;
  if (!absl::SimpleAtod(Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be a number, got '", Get(name), "'"));
  }
  return v;
}

bool Args::GetBool(std::string_view name) const { return Get(name) == "true"; }

std::string Args::Usage(const std::vector<Flag>& flags) {
  std::string out;
  for (const Flag& f : flags) {
    absl::StrAppend(&out, "  --", f.name, f.is_bool ? "" : " VALUE", "\n      ", f.help);
    if (f.required) absl::StrAppend(&out, " (required)");
    if (!f.default_value.empty()) absl::StrAppend(&out, " (default: ", f.default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::map<std::string, Command>& CommandTable() {
  static auto* table = new std::map<std::string, Command>();  // never destroyed: static init order
  return *table;
}

CommandRegistration::CommandRegistration(Command command) {
  std::string name = command.name;
  CommandTable().emplace(std::move(name), std::move(command));
}

std::optional<Args> ParseOrExit(std::string_view command, std::string_view summary,
                                const std::vector<std::string>& argv,
                                const std::vector<Args::Flag>& flags, int* exit_code) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: specd " << command << " [flags]\n"
                << summary << "\n\n"
                << Args::Usage(flags);
      *exit_code = 0;
      return std::nullopt;
    }
  }
  absl::StatusOr<Args> args = Args::Parse(argv, flags);
  if (!args.ok()) {
    std::cerr << "specd " << command << ": " << args.status().message() << "\n\n"
              << Args::Usage(flags);
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
