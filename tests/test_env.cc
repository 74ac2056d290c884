// Linked into every test binary: makes the source and build directories known through the
// environment (SPECD_SOURCE_DIR, SPECD_BUILD_DIR) unless the caller already set them. CTest's
// gtest_discover_tests can pass only one environment variable per test, hence compile definitions.
#include <cstdlib>

namespace {

const bool kEnvironmentSet = [] {
  setenv("SPECD_SOURCE_DIR", SPECD_SOURCE_DIR_DEFAULT, /*overwrite=*/0);
  setenv("SPECD_BUILD_DIR", SPECD_BUILD_DIR_DEFAULT, /*overwrite=*/0);
  return true;
}();

}  // namespace
