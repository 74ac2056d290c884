// A gtest fixture base whose suite shares one copy of WorkerTestSpec's model, written before its
// first test and removed after its last.
#ifndef SPECD_TESTS_COMMON_WORKER_WORKER_MODEL_SUITE_H_
#define SPECD_TESTS_COMMON_WORKER_WORKER_MODEL_SUITE_H_

#include <filesystem>
#include <memory>

#include "gtest/gtest.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd::testing {

template <typename Base = ::testing::Test>
class WorkerModelSuite : public Base {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<ScopedTempDir>();
    WriteSynth(WorkerTestSpec(), dir_->path());
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static const std::filesystem::path& model_dir() { return dir_->path(); }

 private:
  static inline std::unique_ptr<ScopedTempDir> dir_;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_WORKER_WORKER_MODEL_SUITE_H_
