// `specd serve`: starts the target worker, the draft worker and the coordinator on one host,
// waits until they serve, prints the public address, and supervises them. A child that exits
// unexpectedly is restarted on the address it had, with exponential backoff: the coordinator knows
// its workers by address and replays their sequences, so a worker crash costs no request. The
// workers listen on Unix sockets in a directory only this user can enter: no other program can
// take a worker's address while it restarts, and no other local user can call the workers' API,
// which has no authentication. Ctrl-C or SIGTERM stops all three.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/log_line.h"
#include "services/coordinator/coordinator_flags.h"
#include "tools/specd/command.h"

extern char** environ;

namespace specd::cli {
namespace {

constexpr char kProgram[] = "specd serve";

constexpr char kSummary[] =
    "Serve a model with speculative decoding: a target worker, a draft worker and the\n"
    "coordinator, the workers on Unix sockets in a private directory. Prints `listening on\n"
    "HOST:PORT` when ready, as each service does.\n"
    "A child that exits unexpectedly is restarted on the same address (backoff 0.5 s doubling\n"
    "to 10 s); stderr gets one line per restart and one `NAME pid N on ADDR` line per start.\n"
    "Every specd-coordinator flag but its addresses is taken here and passed on: TLS, the\n"
    "bearer token, request limits, drafting and scheduling defaults.\n"
    "  specd serve --target DIR --draft DIR\n"
    "  specd serve --target DIR --draft-exit-layer 2\n"
    "  specd serve --target DIR --draft-method ngram    (prompt lookup: no draft worker)\n"
    "  specd serve --target DIR --draft DIR --http-listen 127.0.0.1:8000  (OpenAI API too; prints\n"
    "    `http on HOST:PORT` first)";

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(500);
constexpr absl::Duration kMaxBackoff = absl::Seconds(10);
// A child that stayed up this long counts as healthy again: its next crash restarts it quickly.
constexpr absl::Duration kStableAfter = absl::Seconds(30);

// A supervised child process.
struct Child {
  std::string name;      // "target worker"
  std::string pid_file;  // "target-worker.pid", under --pid-dir
  std::filesystem::path binary;
  std::vector<std::string> args;  // all but --listen and --metrics-port
  // What to ask for; after the first start, what it got, so that a restart keeps its addresses.
  std::string listen;
  std::string metrics_port;     // "-1" = off
  std::string metrics_address;  // HOST:PORT, once the child has said it
  std::string http_listen;      // the coordinator's HTTP API; "" = off
  pid_t pid = -1;
  int out_fd = -1;     // its stdout, read until it says where it listens (and, for the
                       // coordinator, that it serves)
  std::string unread;  // what was read of it but not yet parsed
  absl::Time started;
  absl::Duration backoff = kFirstBackoff;
  std::optional<absl::Time> restart_at;
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

absl::Status Spawn(Child& child) {
  int pipefd[2];
  // Close-on-exec, so no other child inherits this one's pipe (dup2 clears it on stdout).
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe2() failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The children must see SIGTERM/SIGINT even though this process blocks them.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> argv_s = {child.binary.string(), "--listen", child.listen,
                                     "--metrics-port", child.metrics_port};
  if (!child.http_listen.empty()) argv_s.insert(argv_s.end(), {"--http-listen", child.http_listen});
  argv_s.insert(argv_s.end(), child.args.begin(), child.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc =
      posix_spawnp(&child.pid, child.binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(pipefd[1]);
  if (rc != 0) {
    close(pipefd[0]);
    child.pid = -1;
    return absl::NotFoundError(
        absl::StrCat("cannot start ", child.binary.string(), ": ", std::strerror(rc)));
  }
  child.out_fd = pipefd[0];
  child.unread.clear();
  child.started = absl::Now();
  return absl::OkStatus();
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "stopped";
}

bool StopRequested(const sigset_t& stop_signals) {
  sigset_t pending;
  sigpending(&pending);
  return (sigismember(&stop_signals, SIGTERM) && sigismember(&pending, SIGTERM)) ||
         (sigismember(&stop_signals, SIGINT) && sigismember(&pending, SIGINT));
}

// Reads the child's stdout up to the first line that starts with `prefix`, remembering the
// addresses the lines on the way give ("metrics on HOST:PORT" when metrics are on, "http on ADDR"
// when it serves HTTP, "listening on ADDR"); the child's stderr (load progress) goes straight to
// ours. CANCELLED when a stop signal arrives first (it stays pending for the caller).
absl::Status WaitForLine(Child& child, absl::string_view prefix, const sigset_t& stop_signals) {
  while (true) {
    size_t eol;
    while ((eol = child.unread.find('\n')) != std::string::npos) {
      std::string line = child.unread.substr(0, eol);
      child.unread.erase(0, eol + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (absl::StartsWith(line, "metrics on ")) {
        child.metrics_address = line.substr(11);
        child.metrics_port = line.substr(line.rfind(':') + 1);
      } else if (absl::StartsWith(line, "http on ")) {
        child.http_listen = line.substr(8);
      } else if (absl::StartsWith(line, "listening on ")) {
        child.listen = line.substr(13);
      }
      if (absl::StartsWith(line, prefix)) return absl::OkStatus();
    }
    pollfd p{child.out_fd, POLLIN, 0};
    if (poll(&p, 1, 200) == 0) {
      if (StopRequested(stop_signals)) {
        return absl::CancelledError(absl::StrCat("stopped while the ", child.name, " started"));
      }
      continue;
    }
    char chunk[512];
    const ssize_t n = read(child.out_fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    child.unread.append(chunk, static_cast<size_t>(n));
  }
  int status = 0;
  waitpid(child.pid, &status, 0);
  child.pid = -1;
  close(child.out_fd);
  child.out_fd = -1;
  return absl::UnavailableError(
      absl::StrCat("the ", child.name, " ", DescribeExit(status), " before serving"));
}

void WritePidFile(const Child& child, const std::string& pid_dir) {
  if (pid_dir.empty()) return;
  const std::filesystem::path path = std::filesystem::path(pid_dir) / child.pid_file;
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << child.pid << "\n";
  }
  // Renamed into place so a reader never sees a half-written pid.
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) LogLine(kProgram) << "cannot write " << path.string() << ": " << ec.message();
}

absl::Status Start(Child& child, const sigset_t& stop_signals, const std::string& pid_dir) {
  if (absl::Status st = Spawn(child); !st.ok()) return st;
  if (absl::Status st = WaitForLine(child, "listening on ", stop_signals); !st.ok()) return st;
  WritePidFile(child, pid_dir);
  LogLine(kProgram) << child.name << " pid " << child.pid << " on " << child.listen;
  return absl::OkStatus();
}

// SIGTERM to every child (coordinator first), then SIGKILL to any still running after `grace`:
// a child stuck in start-up must not keep `specd serve` from exiting.
void StopAll(std::vector<Child>& children, absl::Duration grace) {
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    while (it->pid > 0 && absl::Now() < deadline) {
      if (waitpid(it->pid, nullptr, WNOHANG) == it->pid) it->pid = -1;
      if (it->pid > 0) usleep(100 * 1000);
    }
    if (it->pid > 0) {
      kill(it->pid, SIGKILL);
      waitpid(it->pid, nullptr, 0);
      it->pid = -1;
    }
    if (it->out_fd >= 0) close(it->out_fd);
    it->out_fd = -1;
  }
}

void ScheduleRestart(Child& child, absl::Time now) {
  if (now - child.started >= kStableAfter) child.backoff = kFirstBackoff;
  child.restart_at = now + child.backoff;
  LogLine(kProgram) << "restarting the " << child.name << " in "
                    << absl::FormatDuration(child.backoff);
  child.backoff = std::min(child.backoff * 2, kMaxBackoff);
}

// Collects every child that exited and schedules its restart.
void ReapExited(std::vector<Child>& children) {
  for (Child& c : children) {
    int status = 0;
    if (c.pid <= 0 || waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    LogLine(kProgram) << "the " << c.name << " (pid " << c.pid << ") " << DescribeExit(status);
    c.pid = -1;
    if (c.out_fd >= 0) close(c.out_fd);
    c.out_fd = -1;
    ScheduleRestart(c, absl::Now());
  }
}

// Restarts the children that are due. A stop signal during a start leaves the rest alone; it is
// still pending, so the caller sees it next.
void RestartDue(std::vector<Child>& children, const sigset_t& stop_signals,
                const std::string& pid_dir) {
  for (Child& c : children) {
    if (!c.restart_at.has_value() || *c.restart_at > absl::Now()) continue;
    c.restart_at.reset();
    const absl::Status st = Start(c, stop_signals, pid_dir);
    if (st.code() == absl::StatusCode::kCancelled) return;
    if (!st.ok()) {
      LogLine(kProgram) << st.message();
      ScheduleRestart(c, absl::Now());
    }
  }
}

// Waits for a stop signal, a child's exit or the next restart; returns the signal (0 when a
// restart is due).
int WaitForEvent(const std::vector<Child>& children, const sigset_t& signals) {
  std::optional<absl::Time> next;
  for (const Child& c : children) {
    if (c.restart_at.has_value()) next = std::min(next.value_or(*c.restart_at), *c.restart_at);
  }
  if (!next.has_value()) {
    int sig = 0;
    sigwait(&signals, &sig);
    return sig;
  }
  const timespec wait = absl::ToTimespec(std::max(*next - absl::Now(), absl::ZeroDuration()));
  const int sig = sigtimedwait(&signals, nullptr, &wait);
  return sig > 0 ? sig : 0;
}

// A fresh directory, mode 0700, under $TMPDIR (or /tmp when that would make a socket path too
// long for a Unix socket's 108 bytes).
absl::StatusOr<std::string> MakeSocketDir() {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string base = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  if (base.size() > 64) base = "/tmp";
  std::string dir = base + "/specd-serve-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create a directory for the workers' sockets in ", base, ": ", strerror(errno)));
  }
  return dir;
}

int RunServe(const std::vector<std::string>& argv) {
  // Serve's own flags, then the coordinator's (passed on as given).
  std::vector<FlagSpec> flags = {
      {"target", "target model directory", "", false, true},
      {"draft", "draft model directory (same tokenizer as the target)", ""},
      {"draft-exit-layer", "instead of --draft: the target's first L layers as the draft", ""},
      {"draft-vocab",
       "the draft computes logits for its N most frequent tokens only (FR-Spec); 0 = all", "0"},
      {"draft-vocab-file", "token-frequency file ranking the tokens for --draft-vocab", ""},
      {"listen", "public gRPC address of the coordinator", "127.0.0.1:50051"},
      {"backend", "workers' compute back end: cpu, cuda or auto (CUDA when a GPU is present)",
       "auto"},
      {"kv-dtype", "workers' KV cache element type: f32, bf16 or f16", "f32"},
      {"threads", "CPU threads per worker (0 = all cores)", "0"},
      {"kv-tokens", "KV cache capacity per worker, in tokens (on the CPU back end)", "16384"},
      {"gpu-memory-utilization",
       "on a GPU: the share of its memory both workers take together, split so that both KV "
       "pools hold the same number of tokens (each worker's --gpu-memory-fraction); 0 = size "
       "the KV caches by --kv-tokens",
       "0.9"},
      {"prefix-caching", "workers keep and reuse the KV of shared prefixes: on or off", "on"},
      {"max-pass-tokens",
       "tokens of a worker's largest forward pass: its scratch memory is reserved for it and the "
       "coordinator spreads prefill chunks over rounds to stay within it",
       "2048"},
      {"http-listen",
       "also serve the OpenAI-compatible HTTP API on this address (port 0: a free one); unset = "
       "off",
       ""},
      {"metrics", "serve Prometheus /metrics on the coordinator and workers (free ports)", "",
       true},
      {"metrics-port",
       "serve /metrics on fixed ports: the coordinator on PORT, the target worker on PORT+1 and "
       "the draft worker on PORT+2 (implies --metrics)",
       ""},
      {"pid-dir",
       "write each child's pid to DIR/{target-worker,draft-worker,coordinator}.pid, rewritten "
       "on every restart (for scripts that signal them)",
       ""},
      {"bin-dir", "directory of the specd-* service binaries (default: found next to specd)", ""},
  };
  const std::vector<FlagSpec> coordinator_flags = CoordinatorServingFlags();
  flags.insert(flags.end(), coordinator_flags.begin(), coordinator_flags.end());
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("serve", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  if (args->Has("draft") && args->Has("draft-exit-layer")) {
    return ReportError(
        "serve", absl::InvalidArgumentError("give either --draft or --draft-exit-layer, not both"));
  }
  if (args->Get("draft-method") != "ngram" && args->Get("draft-method") != "model") {
    return ReportError("serve", absl::InvalidArgumentError(
                                    absl::StrCat("--draft-method must be model or ngram, got '",
                                                 args->Get("draft-method"), "'")));
  }
  const std::string pid_dir = args->Get("pid-dir");
  if (!pid_dir.empty() && !std::filesystem::is_directory(pid_dir)) {
    return ReportError("serve", absl::InvalidArgumentError(
                                    absl::StrCat("--pid-dir: ", pid_dir, " is not a directory")));
  }
  // The children get the drain (see specd-coordinator --help), then 5 s to exit.
  const absl::StatusOr<int64_t> drain_seconds = args->GetInt("drain-seconds", 0, 3600);
  if (!drain_seconds.ok()) return ReportError("serve", drain_seconds.status());
  const absl::Duration stop_grace = absl::Seconds(*drain_seconds + 5);
  // This thread waits for the stop signals and the children's exits; children get an empty
  // mask (see Spawn).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string bin_dir = args->Get("bin-dir");
  // Each child's /metrics port: -1 off, 0 a free one, else fixed.
  std::array<std::string, 3> metrics_ports;  // coordinator, target, draft
  metrics_ports.fill(args->GetBool("metrics") ? "0" : "-1");
  if (args->Has("metrics-port")) {
    absl::StatusOr<int64_t> base = args->GetInt("metrics-port", 1, 65533);
    if (!base.ok()) return ReportError("serve", base.status());
    for (int64_t i = 0; i < 3; ++i) metrics_ports[static_cast<size_t>(i)] = absl::StrCat(*base + i);
  }
  const std::vector<std::string> common = {"--backend",         args->Get("backend"),
                                           "--kv-dtype",        args->Get("kv-dtype"),
                                           "--threads",         args->Get("threads"),
                                           "--kv-tokens",       args->Get("kv-tokens"),
                                           "--prefix-caching",  args->Get("prefix-caching"),
                                           "--max-pass-tokens", args->Get("max-pass-tokens"),
                                           "--drain-seconds",   args->Get("drain-seconds")};
  // The workers' same-host sockets (--local-socket): the coordinator makes each round's calls
  // there instead of over gRPC. In a directory only this user can enter, gone when serve stops.
  absl::StatusOr<std::string> socket_dir = MakeSocketDir();
  if (!socket_dir.ok()) return ReportError("serve", socket_dir.status());
  const absl::Cleanup remove_socket_dir = [&] {
    std::error_code ignored;
    std::filesystem::remove_all(*socket_dir, ignored);
  };
  std::vector<Child> children;
  children.reserve(3);  // Child references below stay valid
  auto fail = [&](const absl::Status& st) {
    StopAll(children, stop_grace);
    if (st.code() == absl::StatusCode::kCancelled) {  // Ctrl-C while starting
      LogLine(kProgram) << "stopping";
      return 0;
    }
    return ReportError("serve", st);
  };

  Child& target = children.emplace_back();
  target.name = "target worker";
  target.pid_file = "target-worker.pid";
  target.binary = FindBinary("specd-target-worker", bin_dir);
  target.args = {"--model", args->Get("target")};
  target.args.insert(target.args.end(), common.begin(), common.end());
  // On a GPU both workers share the device: each gets the pair's share and the other's model, and
  // sizes its KV pool so that both hold the same number of tokens. The CPU back end ignores it.
  const std::string utilization = args->Get("gpu-memory-utilization");
  const bool split_gpu = args->Get("backend") != "cpu" && utilization != "0";
  const bool has_draft = args->Has("draft") || args->Has("draft-exit-layer");
  const std::string draft_dir = args->Has("draft") ? args->Get("draft") : args->Get("target");
  const std::string draft_exit =
      args->Has("draft-exit-layer") ? args->Get("draft-exit-layer") : "0";
  if (split_gpu) {
    target.args.insert(target.args.end(), {"--gpu-memory-fraction", utilization});
    if (has_draft) {
      target.args.insert(target.args.end(), {"--gpu-memory-peer", draft_dir,
                                             "--gpu-memory-peer-exit-layer", draft_exit});
    }
  }
  target.args.insert(target.args.end(), {"--local-socket", *socket_dir + "/target-worker.sock"});
  target.listen = "unix:" + *socket_dir + "/target-worker-grpc.sock";
  target.metrics_port = metrics_ports[1];
  if (absl::Status st = Start(target, signals, pid_dir); !st.ok()) return fail(st);

  std::string draft_addr;
  if (args->Has("draft") || args->Has("draft-exit-layer")) {
    Child& draft = children.emplace_back();
    draft.name = "draft worker";
    draft.pid_file = "draft-worker.pid";
    draft.binary = FindBinary("specd-draft-worker", bin_dir);
    draft.args = {"--model", args->Has("draft") ? args->Get("draft") : args->Get("target")};
    if (args->Has("draft-exit-layer")) {
      draft.args.insert(draft.args.end(), {"--exit-layer", args->Get("draft-exit-layer")});
    }
    draft.args.insert(draft.args.end(), {"--draft-vocab", args->Get("draft-vocab")});
    if (args->Has("draft-vocab-file")) {
      draft.args.insert(draft.args.end(), {"--draft-vocab-file", args->Get("draft-vocab-file")});
    }
    draft.args.insert(draft.args.end(), common.begin(), common.end());
    if (split_gpu) {
      draft.args.insert(draft.args.end(), {"--gpu-memory-fraction", utilization,
                                           "--gpu-memory-peer", args->Get("target")});
    }
    draft.args.insert(draft.args.end(), {"--local-socket", *socket_dir + "/draft-worker.sock"});
    draft.listen = "unix:" + *socket_dir + "/draft-worker-grpc.sock";
    draft.metrics_port = metrics_ports[2];
    if (absl::Status st = Start(draft, signals, pid_dir); !st.ok()) return fail(st);
    draft_addr = draft.listen;
  }

  Child& coord = children.emplace_back();
  coord.name = "coordinator";
  coord.pid_file = "coordinator.pid";
  coord.binary = FindBinary("specd-coordinator", bin_dir);
  coord.args = {"--target", children.front().listen};
  if (!draft_addr.empty()) coord.args.insert(coord.args.end(), {"--draft", draft_addr});
  for (const FlagSpec& flag : coordinator_flags) {
    if (!args->Has(flag.name)) continue;
    if (flag.is_bool) {
      coord.args.push_back(absl::StrCat("--", flag.name, "=", args->Get(flag.name)));
    } else {
      coord.args.insert(coord.args.end(), {absl::StrCat("--", flag.name), args->Get(flag.name)});
    }
  }
  // Asked for once; a restart reuses the address the coordinator got (see WaitForAddress).
  coord.http_listen = args->Get("http-listen");
  coord.listen = args->Get("listen");
  coord.metrics_port = metrics_ports[0];
  if (absl::Status st = Start(coord, signals, pid_dir); !st.ok()) return fail(st);
  // The coordinator listens before it has checked its workers; announce the address only once
  // it says it serves (health SERVING), so a client that connects right away is served. Its own
  // --worker-wait-seconds bounds the wait: it exits when the workers do not answer.
  if (absl::Status st = WaitForLine(coord, "serving on ", signals); !st.ok()) return fail(st);
  for (const Child& child : children) {
    if (!child.metrics_address.empty()) {
      std::cout << child.name << " metrics on http://" << child.metrics_address << "/metrics\n";
    }
  }
  if (!coord.http_listen.empty()) std::cout << "http on " << coord.http_listen << std::endl;
  std::cout << "listening on " << coord.listen << std::endl;

  while (true) {
    const int sig = WaitForEvent(children, signals);
    if (sig == SIGTERM || sig == SIGINT) break;
    ReapExited(children);
    RestartDue(children, signals, pid_dir);
  }
  LogLine(kProgram) << "stopping";
  StopAll(children, stop_grace);
  return 0;
}

const CommandRegistration kRegistration({"serve", kSummary, RunServe});

}  // namespace
}  // namespace specd::cli
