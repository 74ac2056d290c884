#include "tests/services/worker_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace specd::testing {
namespace {

// Generous: a start-up normally takes well under a second; this only stops a hung test.
constexpr int kStartTimeoutMs = 60'000;

std::filesystem::path TempStderrPath() {
  std::random_device rd;
  return std::filesystem::temp_directory_path() /
         ("specd-child-" + std::to_string(rd()) + "-" + std::to_string(rd()) + ".stderr");
}

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Forks and execs; stdout goes to `stdout_fd` (or /dev/null when -1), stderr to `stderr_path`.
absl::StatusOr<pid_t> Spawn(const std::filesystem::path& binary,
                            const std::vector<std::string>& args, int stdout_fd,
                            const std::filesystem::path& stderr_path) {
  if (!std::filesystem::exists(binary)) {
    return absl::NotFoundError(absl::StrCat(binary.string(), " does not exist (build it first)"));
  }
  std::vector<std::string> argv_storage = {binary.string()};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    const int out = stdout_fd >= 0 ? stdout_fd : open("/dev/null", O_WRONLY);
    if (out >= 0) dup2(out, STDOUT_FILENO);
    // The test runner may block signals; the child must see SIGTERM as a fresh process would.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::filesystem::path BuiltBinary(const std::string& relative) {
  const char* dir = std::getenv("SPECD_BUILD_DIR");
  return std::filesystem::path(dir != nullptr ? dir : ".") / relative;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::filesystem::path& binary, const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess());
  child->stderr_path_ = TempStderrPath();
  absl::StatusOr<pid_t> pid = Spawn(binary, args, fds[1], child->stderr_path_);
  close(fds[1]);
  child->stdout_fd_ = fds[0];
  if (!pid.ok()) return pid.status();
  child->pid_ = *pid;

  std::string buffer;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kStartTimeoutMs);
  while (true) {
    size_t eol;
    while ((eol = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, eol);
      buffer.erase(0, eol + 1);
      child->startup_lines_.push_back(line);
      if (absl::StartsWith(line, "listening on unix")) {
        child->address_ = line.substr(13);
        return child;
      }
      int* port = absl::StartsWith(line, "listening on ") ? &child->port_
                  : absl::StartsWith(line, "metrics on ") ? &child->metrics_port_
                  : absl::StartsWith(line, "http on ")    ? &child->http_port_
                                                          : nullptr;
      if (port == nullptr) continue;
      if (!absl::SimpleAtoi(line.substr(line.rfind(':') + 1), port)) {
        return absl::InternalError(absl::StrCat("cannot parse '", line, "'"));
      }
      if (child->port_ != 0) {
        child->address_ = absl::StrCat("127.0.0.1:", child->port_);
        return child;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{child->stdout_fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(binary.string(), " printed no port; stderr:\n", child->StderrText()));
    }
    char chunk[512];
    const ssize_t n = read(child->stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat(binary.string(), " exited with code ",
                                                 child->Wait(), " before listening; stderr:\n",
                                                 child->StderrText()));
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

absl::StatusOr<int> ChildProcess::Run(const std::filesystem::path& binary,
                                      const std::vector<std::string>& args,
                                      std::string* stderr_text) {
  const std::filesystem::path err = TempStderrPath();
  absl::StatusOr<pid_t> pid = Spawn(binary, args, -1, err);
  if (!pid.ok()) return pid.status();
  int status = 0;
  waitpid(*pid, &status, 0);
  *stderr_text = ReadAll(err);
  std::error_code ec;
  std::filesystem::remove(err, ec);
  return ExitCode(status);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait();
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  std::error_code ec;
  if (!stderr_path_.empty()) std::filesystem::remove(stderr_path_, ec);
}

std::shared_ptr<grpc::Channel> ChildProcess::Channel() const {
  return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
}

int ChildProcess::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return ExitCode(status);
}

int ChildProcess::Terminate() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  return Wait();
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

std::string ChildProcess::StderrText() const { return ReadAll(stderr_path_); }

absl::Status StopProcess(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid, ", SIGSTOP) failed: errno ", errno));
  }
  const std::filesystem::path tasks = absl::StrCat("/proc/", pid, "/task");
  for (int i = 0; i < 5000; ++i) {
    bool all_stopped = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      // "TID (COMM) STATE ...": COMM may hold spaces and parentheses, so the state follows the
      // last ')'. 'T' is stopped by a signal.
      const std::string stat = ReadAll(task.path() / "stat");
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
        all_stopped = false;
        break;
      }
    }
    if (ec) return absl::InternalError(absl::StrCat("cannot list ", tasks.string()));
    if (all_stopped) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::DeadlineExceededError(absl::StrCat("pid ", pid, " did not stop within 5 s"));
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string response;
  char chunk[4096];
  ssize_t n;
  while ((n = read(fd, chunk, sizeof(chunk))) > 0) response.append(chunk, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos) {
    return absl::DataLossError(absl::StrCat("not an HTTP response: ", response.substr(0, 100)));
  }
  if (response.find(" 200 ") > response.find("\r\n")) {
    return absl::UnavailableError(
        absl::StrCat("HTTP error: ", response.substr(0, response.find("\r\n"))));
  }
  return response.substr(body + 4);
}

double MetricValue(int port, const std::string& series) {
  const absl::StatusOr<std::string> text = HttpGet(port, "/metrics");
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return -1;
  const size_t at = text->find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text->substr(at + series.size() + 2));
}

}  // namespace specd::testing
