// LogLine writes each line whole: processes and threads sharing one stderr (the children of
// `specd serve`) never see a line of theirs split by another's.
#include "base/log_line.h"

#include <fcntl.h>
#include <unistd.h>

#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

// Points stderr at a pipe for the test's lifetime, and reads back what was written.
class CapturedStderr {
 public:
  CapturedStderr() {
    EXPECT_EQ(pipe(fds_), 0);
    // Big enough for everything the test writes, so the writers never block on the reader.
    fcntl(fds_[1], F_SETPIPE_SZ, 1 << 20);
    saved_ = dup(STDERR_FILENO);
    dup2(fds_[1], STDERR_FILENO);
    close(fds_[1]);
  }
  ~CapturedStderr() {
    Restore();
    close(fds_[0]);
  }
  std::string Finish() {
    Restore();
    std::string all;
    char chunk[4096];
    ssize_t n;
    while ((n = read(fds_[0], chunk, sizeof(chunk))) > 0) all.append(chunk, static_cast<size_t>(n));
    return all;
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    saved_ = -1;
  }
  int fds_[2] = {-1, -1};
  int saved_ = -1;
};

TEST(LogLine, PrefixesTheProgramAndEndsTheLine) {
  CapturedStderr err;
  LogLine("specd-target-worker") << "loaded " << 12 << " layers in " << 0.5 << " s";
  LogLine("specd-coordinator") << "stopped";
  EXPECT_EQ(err.Finish(),
            "specd-target-worker: loaded 12 layers in 0.5 s\nspecd-coordinator: stopped\n");
}

constexpr int kThreads = 4, kLines = 500;

TEST(LogLine, LinesFromConcurrentWritersStayWhole) {
  CapturedStderr err;
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) {
        // Many pieces per line, as the services' log lines have.
        LogLine(absl::StrCat("writer", t))
            << "line " << i << " of " << kLines << ", piece " << 'a' << 'b' << 'c' << " end";
      }
    });
  }
  for (std::thread& w : writers) w.join();
  const std::string all = err.Finish();
  std::set<std::string> want;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kLines; ++i) {
      want.insert(absl::StrCat("writer", t, ": line ", i, " of ", kLines, ", piece abc end"));
    }
  }
  std::vector<std::string> got = absl::StrSplit(all, '\n', absl::SkipEmpty());
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), want);
}

}  // namespace
}  // namespace specd
