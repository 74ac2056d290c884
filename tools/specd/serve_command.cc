// `specd serve`: starts the target worker, the draft worker and the coordinator on loopback,
// waits until they serve, prints the public address, and stops all three on Ctrl-C or SIGTERM.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/specd/command.h"
#include "tools/specd/health_check.h"

extern char** environ;

namespace specd::cli {
namespace {

constexpr char kSummary[] =
    "Serve a model with speculative decoding: a target worker, a draft worker and the\n"
    "coordinator, on loopback. Prints `listening on HOST:PORT` when ready, as each service does.\n"
    "  specd serve --target DIR --draft DIR\n"
    "  specd serve --target DIR --draft-exit-layer 2";

// A child process whose stdout we read line by line until it says where it listens.
struct Child {
  std::string name;
  pid_t pid = -1;
  FILE* out = nullptr;
};

std::filesystem::path FindBinary(const std::string& name, const std::string& bin_dir) {
  std::vector<std::filesystem::path> dirs;
  if (!bin_dir.empty()) dirs.emplace_back(bin_dir);
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path here = self.parent_path();
    dirs.push_back(here);  // installed side by side
    const std::string service = name == "specd-coordinator"    ? "coordinator"
                                : name == "specd-draft-worker" ? "draft_worker"
                                                               : "target_worker";
    dirs.push_back(here.parent_path() / "services" / service);  // the build tree
  }
  for (const auto& d : dirs) {
    if (std::filesystem::exists(d / name)) return d / name;
  }
  return name;  // let PATH decide
}

absl::StatusOr<Child> Spawn(const std::string& name, const std::filesystem::path& binary,
                            const std::vector<std::string>& args) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return absl::InternalError("pipe() failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipefd[0]);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The children must see SIGTERM/SIGINT even though this process blocks them.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> argv_s = {binary.string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child child;
  child.name = name;
  const int rc = posix_spawnp(&child.pid, binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(pipefd[1]);
  if (rc != 0) {
    close(pipefd[0]);
    return absl::NotFoundError(
        absl::StrCat("cannot start ", binary.string(), ": ", std::strerror(rc)));
  }
  child.out = fdopen(pipefd[0], "r");
  return child;
}

// Reads the child's stdout until "listening on ADDR"; the child's stderr (load progress) goes
// straight to ours.
absl::StatusOr<std::string> WaitForAddress(Child& child) {
  char line[512];
  while (std::fgets(line, sizeof line, child.out) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (absl::StartsWith(s, "listening on ")) return s.substr(13);
  }
  int status = 0;
  waitpid(child.pid, &status, 0);
  child.pid = -1;
  return absl::UnavailableError(absl::StrCat(
      child.name, " exited before serving (",
      WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status)) : std::string("killed"),
      ")"));
}

// SIGTERM to every child (coordinator first), then SIGKILL to any still running after 15 s: a
// child stuck in start-up must not keep `specd serve` from exiting.
void StopAll(std::vector<Child>& children) {
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    for (int i = 0; it->pid > 0 && i < 150; ++i) {
      if (waitpid(it->pid, nullptr, WNOHANG) == it->pid) it->pid = -1;
      if (it->pid > 0) usleep(100 * 1000);
    }
    if (it->pid > 0) {
      kill(it->pid, SIGKILL);
      waitpid(it->pid, nullptr, 0);
    }
    if (it->out != nullptr) fclose(it->out);
  }
}

int RunServe(const std::vector<std::string>& argv) {
  const std::vector<Args::Flag> flags = {
      {"target", "target model directory", "", false, true},
      {"draft", "draft model directory (same tokenizer as the target)"},
      {"draft-exit-layer", "instead of --draft: the target's first L layers as the draft"},
      {"listen", "public gRPC address of the coordinator", "127.0.0.1:50051"},
      {"threads", "CPU threads per worker (0 = all cores)", "0"},
      {"kv-tokens", "KV cache capacity per worker, in tokens", "16384"},
      {"default-k", "num_speculative_tokens when a request does not say", "4"},
      {"max-running", "sequences in the running batch", "32"},
      {"metrics", "serve Prometheus /metrics on the coordinator and workers (free ports)", "",
       true},
      {"bin-dir", "directory of the specd-* service binaries (default: found next to specd)"},
  };
  int exit_code = 0;
  std::optional<Args> args = ParseOrExit("serve", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  if (args->Has("draft") && args->Has("draft-exit-layer")) {
    return ReportError(
        "serve", absl::InvalidArgumentError("give either --draft or --draft-exit-layer, not both"));
  }
  // This thread waits for the stop signals; children get an empty mask (see Spawn).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string bin_dir = args->Get("bin-dir");
  const std::string metrics = args->GetBool("metrics") ? "0" : "-1";
  std::vector<std::string> common = {"--threads",      args->Get("threads"),
                                     "--kv-tokens",    args->Get("kv-tokens"),
                                     "--metrics-port", metrics};
  std::vector<Child> children;
  auto fail = [&](const absl::Status& st) {
    StopAll(children);
    return ReportError("serve", st);
  };
  std::vector<std::string> target_args = {"--model", args->Get("target")};
  target_args.insert(target_args.end(), common.begin(), common.end());
  absl::StatusOr<Child> target =
      Spawn("target worker", FindBinary("specd-target-worker", bin_dir), target_args);
  if (!target.ok()) return fail(target.status());
  children.push_back(*target);
  absl::StatusOr<std::string> target_addr = WaitForAddress(children.back());
  if (!target_addr.ok()) return fail(target_addr.status());

  std::string draft_addr;
  if (args->Has("draft") || args->Has("draft-exit-layer")) {
    std::vector<std::string> draft_args = {
        "--model", args->Has("draft") ? args->Get("draft") : args->Get("target")};
    if (args->Has("draft-exit-layer")) {
      draft_args.insert(draft_args.end(), {"--exit-layer", args->Get("draft-exit-layer")});
    }
    draft_args.insert(draft_args.end(), common.begin(), common.end());
    absl::StatusOr<Child> draft =
        Spawn("draft worker", FindBinary("specd-draft-worker", bin_dir), draft_args);
    if (!draft.ok()) return fail(draft.status());
    children.push_back(*draft);
    absl::StatusOr<std::string> addr = WaitForAddress(children.back());
    if (!addr.ok()) return fail(addr.status());
    draft_addr = *addr;
  }

  std::vector<std::string> coord_args = {"--listen",       args->Get("listen"),
                                         "--target",       *target_addr,
                                         "--default-k",    args->Get("default-k"),
                                         "--max-running",  args->Get("max-running"),
                                         "--metrics-port", metrics};
  if (!draft_addr.empty()) coord_args.insert(coord_args.end(), {"--draft", draft_addr});
  absl::StatusOr<Child> coord =
      Spawn("coordinator", FindBinary("specd-coordinator", bin_dir), coord_args);
  if (!coord.ok()) return fail(coord.status());
  children.push_back(*coord);
  absl::StatusOr<std::string> public_addr = WaitForAddress(children.back());
  if (!public_addr.ok()) return fail(public_addr.status());
  // The coordinator listens before it has checked its workers; announce the address only once
  // its health says SERVING, so a client that connects right away is served.
  bool serving = false;
  for (int i = 0; i < 1200 && !serving; ++i) {
    absl::StatusOr<bool> s = IsServing(*public_addr, "", 1.0);
    serving = s.ok() && *s;
    if (!serving) usleep(100 * 1000);
    int status = 0;
    if (waitpid(children.back().pid, &status, WNOHANG) == children.back().pid) {
      children.back().pid = -1;
      return fail(absl::UnavailableError("the coordinator exited before serving"));
    }
  }
  if (!serving) {
    return fail(absl::DeadlineExceededError("the coordinator did not become SERVING in 120 s"));
  }
  std::cout << "listening on " << *public_addr << std::endl;

  int sig = 0;
  while (true) {
    sigwait(&stop_signals, &sig);
    if (sig != SIGCHLD) break;
    // A child died: stop the others rather than serve half a system.
    bool died = false;
    for (Child& c : children) {
      int status = 0;
      if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        std::cerr << "specd serve: the " << c.name << " exited; stopping" << std::endl;
        c.pid = -1;
        died = true;
      }
    }
    if (died) {
      StopAll(children);
      return 1;
    }
  }
  std::cerr << "specd serve: stopping" << std::endl;
  StopAll(children);
  return 0;
}

const CommandRegistration kRegistration({"serve", kSummary, RunServe});

}  // namespace
}  // namespace specd::cli
