#include "base/log_line.h"

#include <unistd.h>

#include <cerrno>
#include <string>

namespace specd {

LogLine::LogLine(absl::string_view program) { text_ << program << ": "; }

LogLine::~LogLine() {
  text_ << '\n';
  const std::string line = text_.str();
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing else to tell
    done += static_cast<size_t>(n);
  }
}

}  // namespace specd
