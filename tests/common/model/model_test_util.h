// Helpers for the model-loading tests: the independent Python reference scripts beside this file,
// and small file utilities.
#ifndef SPECD_TESTS_COMMON_MODEL_MODEL_TEST_UTIL_H_
#define SPECD_TESTS_COMMON_MODEL_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specd::testing {

// The system interpreter, which has numpy (the pyenv `python3` on PATH may not).
inline constexpr char kPython[] = "/usr/bin/python3";

inline std::filesystem::path ModelTestScript(const std::string& name) {
  return SourceDir() / "tests" / "common" / "model" / name;
}

inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `/usr/bin/python3 script args...`; returns its stdout. Fails the test (and returns "") if
// the script exits non-zero.
inline std::string RunPython(const std::string& script, const std::vector<std::string>& args) {
  std::string command = absl::StrCat(kPython, " ", ShellQuote(ModelTestScript(script).string()));
  for (const std::string& a : args) absl::StrAppend(&command, " ", ShellQuote(a));
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return "";
  }
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe.get())) > 0) out.append(buffer, n);
  const int status = pclose(pipe.release());
  if (status != 0) {
    ADD_FAILURE() << command << " failed (status " << status
                  << "); it needs /usr/bin/python3 with numpy (Debian python3-numpy)";
    return "";
  }
  return out;
}

inline std::string ReadFileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFileBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline std::string HexToBytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

inline nlohmann::json ReadJson(const std::filesystem::path& path) {
  return nlohmann::json::parse(ReadFileBytes(path), nullptr, /*allow_exceptions=*/false);
}

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_MODEL_MODEL_TEST_UTIL_H_
