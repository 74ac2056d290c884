// A one-line progress display on stderr for long work (model loading, writing, benchmarks). Work
// that finishes within a second shows nothing. On a terminal the line redraws in place; otherwise
// it prints a line every 10%, so logs stay quiet.
#ifndef SPECD_TOOLS_SPECD_PROGRESS_H_
#define SPECD_TOOLS_SPECD_PROGRESS_H_

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace specd::cli {

class Progress {
 public:
  explicit Progress(std::string label)
      : label_(std::move(label)),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void Update(int64_t done, int64_t total, const char* unit) {
    if (total <= 0 || seconds() < kQuietSeconds) return;
    const int pct = static_cast<int>(100 * done / total);
    if (tty_) {
      const int width = 30;
      const int fill = pct * width / 100;
      std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% (%lld/%lld %s)", label_.c_str(), fill,
                   "##############################", width - fill, "", pct,
                   static_cast<long long>(done), static_cast<long long>(total), unit);
      drawn_ = true;
    } else if (pct / 10 > last_decile_) {
      last_decile_ = pct / 10;
      std::fprintf(stderr, "%s: %d%%\n", label_.c_str(), pct);
    }
  }

  void Done() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  static constexpr double kQuietSeconds = 1.0;
  std::string label_;
  bool tty_;
  bool drawn_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_PROGRESS_H_
