// One line on stderr, "PROGRAM: TEXT\n", written with a single write(2) when the LogLine goes out
// of scope. The processes of `specd serve` share one stderr, and std::cerr, being unbuffered,
// writes every << piece on its own, so their lines interleaved mid-line. A write of one line to
// a pipe is atomic up to PIPE_BUF (4 KiB), so lines stay whole.
//
//   LogLine(kProgram) << "loaded " << layers << " layers";
#ifndef SPECD_BASE_LOG_LINE_H_
#define SPECD_BASE_LOG_LINE_H_

#include <sstream>

#include "absl/strings/string_view.h"

namespace specd {

class LogLine {
 public:
  explicit LogLine(absl::string_view program);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    text_ << value;
    return *this;
  }

 private:
  std::ostringstream text_;
};

}  // namespace specd

#endif  // SPECD_BASE_LOG_LINE_H_
