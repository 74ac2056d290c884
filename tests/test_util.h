// Helpers shared by the test suite.
#ifndef SPECD_TESTS_TEST_UTIL_H_
#define SPECD_TESTS_TEST_UTIL_H_

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specd::testing {

// The project's shared data (golden files, reference models and tokenizers) is found through one
// variable, SPECD_SHARED_DIR. A user's clone does not have it; .ci/run sets it and insists on it.
inline std::optional<std::filesystem::path> SharedDir() {
  const char* dir = std::getenv("SPECD_SHARED_DIR");
  if (dir == nullptr || *dir == '\0' || !std::filesystem::is_directory(dir)) return std::nullopt;
  return std::filesystem::path(dir);
}

// Root of the source tree (set by CTest), for test data and reference scripts.
inline std::filesystem::path SourceDir() {
  const char* dir = std::getenv("SPECD_SOURCE_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::current_path();
}

// The Python that runs the numpy references: Debian's python3-numpy (/usr/bin/python3), unless
// SPECD_PYTHON names another (on the GPU machine numpy lives in the image's own Python).
inline std::string Python() {
  const char* python = std::getenv("SPECD_PYTHON");
  return python != nullptr && *python != '\0' ? std::string(python) : "/usr/bin/python3";
}

// Runs the reference script `script` (a path under SourceDir()) as `script MODEL_DIR OUT ARGS` on
// Python(), and returns the `count` float64 values it wrote to OUT. Fails the test on a non-zero
// exit or a short output.
inline std::vector<double> RunF64Reference(const std::string& script,
                                           const std::filesystem::path& model_dir,
                                           const std::filesystem::path& out,
                                           const std::string& args, size_t count) {
  const std::string cmd = Python() + " " + (SourceDir() / script).string() + " " +
                          model_dir.string() + " " + out.string() + " " + args;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<double> values(count);
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(values.data()),
         static_cast<std::streamsize>(values.size() * sizeof(double)));
  EXPECT_TRUE(f.good()) << "short reference output from " << cmd;
  return values;
}

// A fresh directory under the system temp dir, removed when the object dies.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("specd-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace specd::testing

// Skips the current test, with a message saying why, when ../shared is absent.
#define SPECD_REQUIRE_SHARED_DIR(var)                                                         \
  const auto var##_opt = ::specd::testing::SharedDir();                                       \
  if (!var##_opt) {                                                                           \
    GTEST_SKIP() << "SPECD_SHARED_DIR is not set or missing; the shared golden data is only " \
                    "in the project's checkout (CI sets it)";                                 \
  }                                                                                           \
  const std::filesystem::path var = *var##_opt

#endif  // SPECD_TESTS_TEST_UTIL_H_
