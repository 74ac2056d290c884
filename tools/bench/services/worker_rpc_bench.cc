// Where a worker call's time goes outside the forward pass, measured against a running target
// worker (`specd-target-worker`, or the one `specd serve` starts). Three calls, interleaved so
// that the machine's drift hits each alike, on one channel:
//  * grpc.health.v1.Health/Check, which gRPC answers on its own threads: the floor of any unary
//    call on this machine (client, transport, server);
//  * Release of a sequence the worker does not hold, which goes through the worker's engine
//    thread and back with no engine work: the floor plus the hand-off;
//  * a K = 0 Verify, one decode step of one sequence: that, plus the codec, the worker runtime's
//    bookkeeping and the forward pass, which the reply times (forward_ns) and which is subtracted.
// The last line is what `specd bench` reports as a K = 0 round's overhead, less the coordinator's
// own work. Beside them, interleaved too, the machine's own floor for any same-host call: a
// 32-byte ping-pong with a child process over a Unix socketpair (two wake-ups, no gRPC), which
// bounds what a path around gRPC could save. Where the worker serves a --local-socket (as under
// `specd serve`), the engine-thread call and the Verify are timed over it as well, interleaved:
// the path the coordinator takes there. Speed is never asserted: these are figures to read side
// by side.
//
// usage: worker_rpc_bench --target ADDR [--calls N] [--prompt-len P] [--steps S] [--json FILE]
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "common/protocol/worker_protocol.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/common/local_frame.h"
#include "services/common/worker_codec.h"
#include "services/coordinator/local_channel.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd {
namespace {

namespace pb = worker::v1;
using Clock = std::chrono::steady_clock;

constexpr SeqId kAbsentSeq = 0x7fffffff00000001;  // never one the bench itself creates
constexpr SeqId kFirstSeq = 0x5eed0000;
constexpr SeqId kFirstLocalSeq = 0x5eed0000'0000;

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

struct Summary {
  double median = 0, p10 = 0, p90 = 0;
};

Summary Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto at = [&v](double q) { return v[static_cast<size_t>(q * (v.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// A child process that echoes 32-byte messages over a Unix socketpair: the round trip of two
// same-host wake-ups with nothing else on the path.
class EchoChild {
 public:
  static absl::StatusOr<std::unique_ptr<EchoChild>> Start() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
      return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
    }
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {  // only async-signal-safe calls: the parent has gRPC's threads
      close(fds[0]);
      char buf[kBytes];
      while (read(fds[1], buf, kBytes) == kBytes && write(fds[1], buf, kBytes) == kBytes) {
      }
      _exit(0);
    }
    close(fds[1]);
    return std::unique_ptr<EchoChild>(new EchoChild(pid, fds[0]));
  }

  ~EchoChild() {
    close(fd_);  // the child reads EOF and exits
    waitpid(pid_, nullptr, 0);
  }
  EchoChild(const EchoChild&) = delete;
  EchoChild& operator=(const EchoChild&) = delete;

  absl::StatusOr<double> RoundTripMicros() {
    char buf[kBytes] = {};
    const Clock::time_point start = Clock::now();
    if (write(fd_, buf, kBytes) != kBytes || read(fd_, buf, kBytes) != kBytes) {
      return absl::InternalError("the echoing child process stopped answering");
    }
    return MicrosSince(start);
  }

 private:
  static constexpr ssize_t kBytes = 32;
  EchoChild(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  const pid_t pid_;
  const int fd_;
};

absl::Status Check(const grpc::Status& st, const std::string& what) {
  if (st.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, " failed: ", st.error_message()));
}

// A worker's Verify and Release, over gRPC or over its local socket.
struct Transport {
  std::function<absl::Status(const pb::VerifyRequest&, pb::VerifyResponse*)> verify;
  std::function<absl::Status(const pb::ReleaseRequest&, pb::ReleaseResponse*)> release;
};

Transport GrpcTransport(pb::TargetWorker::Stub* stub) {
  return {[stub](const pb::VerifyRequest& req, pb::VerifyResponse* resp) {
            grpc::ClientContext ctx;
            return Check(stub->Verify(&ctx, req, resp), "Verify");
          },
          [stub](const pb::ReleaseRequest& req, pb::ReleaseResponse* resp) {
            grpc::ClientContext ctx;
            const grpc::Status st = stub->Release(&ctx, req, resp);
            return st.error_code() == grpc::StatusCode::NOT_FOUND
                       ? absl::NotFoundError(st.error_message())
                       : Check(st, "Release");
          }};
}

Transport LocalTransport(LocalChannel* channel) {
  const auto deadline = [] { return absl::Now() + absl::Seconds(30); };
  return {[channel, deadline](const pb::VerifyRequest& req, pb::VerifyResponse* resp) {
            return channel->Call(local::Method::kVerify, req, resp, deadline());
          },
          [channel, deadline](const pb::ReleaseRequest& req, pb::ReleaseResponse* resp) {
            return channel->Call(local::Method::kRelease, req, resp, deadline());
          }};
}

// Release of a sequence the worker does not hold: the engine-thread round trip, in microseconds.
absl::StatusOr<double> ReleaseAbsent(const Transport& transport) {
  pb::ReleaseRequest req;
  req.set_seq_id(kAbsentSeq);
  pb::ReleaseResponse resp;
  const Clock::time_point start = Clock::now();
  const absl::Status st = transport.release(req, &resp);
  const double us = MicrosSince(start);
  if (!absl::IsNotFound(st)) {
    return absl::InternalError(
        absl::StrCat("Release of an unknown sequence should be NOT_FOUND; got ", st.ToString()));
  }
  return us;
}

// One greedy sequence decoded one token per K = 0 Verify, restarted (Release, new id) every
// `steps` tokens so that it never nears the context limit.
class Decoder {
 public:
  Decoder(Transport transport, SeqId first_seq, int64_t prompt_len, int64_t steps, int32_t vocab)
      : transport_(std::move(transport)),
        seq_(first_seq),
        prompt_len_(prompt_len),
        steps_(steps),
        vocab_(vocab) {}
  // A run that stopped on an error still gives the worker its blocks back.
  ~Decoder() {
    if (holds_) (void)Restart();
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Latency of the call, in microseconds, and the forward pass it reports.
  absl::Status Step(double* micros, double* forward_micros) {
    VerifySequenceRequest r;
    r.seq = seq_;
    r.sampling.temperature = 0.0f;
    r.expected_cached_len = cached_;
    if (cached_ == 0) {
      for (int64_t i = 0; i < prompt_len_; ++i) {
        r.catch_up.push_back(static_cast<int32_t>((7 * i + 1) % vocab_));
      }
    } else {
      r.catch_up = {last_};
    }
    pb::VerifyRequest req;
    codec::Encode(r, req.add_sequences());
    pb::VerifyResponse resp;
    holds_ = true;  // the worker may hold the sequence from here on, whatever the reply
    const Clock::time_point start = Clock::now();
    if (absl::Status st = transport_.verify(req, &resp); !st.ok()) return st;
    if (resp.results_size() != 1) return absl::InternalError("Verify answered no sequence");
    const VerifySequenceResult result = codec::Decode(resp.results(0), resp.forward_ns());
    *micros = MicrosSince(start);
    *forward_micros = static_cast<double>(result.forward_ns) / 1e3;
    if (!result.status.ok()) return result.status;
    cached_ = result.cached_len;
    last_ = result.bonus_token;
    if (++produced_ == steps_) return Restart();
    return absl::OkStatus();
  }

  absl::Status Restart() {
    pb::ReleaseRequest req;
    req.set_seq_id(seq_);
    pb::ReleaseResponse resp;
    absl::Status st = transport_.release(req, &resp);
    ++seq_;
    holds_ = false;
    cached_ = 0;
    produced_ = 0;
    return st;
  }

 private:
  const Transport transport_;
  SeqId seq_;
  const int64_t prompt_len_, steps_;
  const int32_t vocab_;
  bool holds_ = false;
  int64_t cached_ = 0, produced_ = 0;
  int32_t last_ = 0;
};

absl::Status Run(const Flags& flags) {
  const std::string address = flags.Get("target");
  absl::StatusOr<int64_t> calls = flags.GetInt("calls", 10, 1000000);
  absl::StatusOr<int64_t> prompt_len = flags.GetInt("prompt-len", 1, 100000);
  absl::StatusOr<int64_t> steps = flags.GetInt("steps", 1, 100000);
  if (!calls.ok()) return calls.status();
  if (!prompt_len.ok()) return prompt_len.status();
  if (!steps.ok()) return steps.status();

  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return absl::UnavailableError(absl::StrCat("no worker listens at ", address));
  }
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto target = pb::TargetWorker::NewStub(channel);
  pb::InfoResponse info;
  {
    grpc::ClientContext ctx;
    const grpc::Status st = target->Info(&ctx, pb::InfoRequest(), &info);
    if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(absl::StrCat(
          address,
          " does not serve specd.worker.v1.TargetWorker: give a target worker's address "
          "(`specd serve` prints it as \"target worker pid N on ADDR\")"));
    }
    if (absl::Status s = Check(st, "Info"); !s.ok()) return s;
  }
  const int32_t vocab = static_cast<int32_t>(info.vocab_size());
  const Transport grpc_transport = GrpcTransport(target.get());
  Decoder decoder(grpc_transport, kFirstSeq, *prompt_len, *steps, vocab);
  // The same calls over the worker's local socket, where it has one on this host.
  std::unique_ptr<LocalChannel> same_host;
  if (!info.local_socket().empty()) {
    absl::StatusOr<std::unique_ptr<LocalChannel>> opened =
        LocalChannel::Open(info.local_socket(), info.epoch(), absl::Seconds(5));
    if (!opened.ok()) return opened.status();
    same_host = *std::move(opened);
  }
  std::optional<Transport> local_transport;
  std::optional<Decoder> local_decoder;
  if (same_host != nullptr) {
    local_transport = LocalTransport(same_host.get());
    local_decoder.emplace(*local_transport, kFirstLocalSeq, *prompt_len, *steps, vocab);
  }

  absl::StatusOr<std::unique_ptr<EchoChild>> echo = EchoChild::Start();
  if (!echo.ok()) return echo.status();
  std::vector<double> os_us, floor_us, handoff_us, verify_us, forward_us, beyond_us;
  std::vector<double> local_handoff_us, local_beyond_us;
  // The first calls warm the connection and the worker's buffers; they are not counted.
  const int64_t warmup = std::min<int64_t>(*calls / 10, 50);
  for (int64_t i = 0; i < warmup + *calls; ++i) {
    const bool keep = i >= warmup;
    absl::StatusOr<double> os = (*echo)->RoundTripMicros();
    if (!os.ok()) return os.status();
    if (keep) os_us.push_back(*os);
    {
      grpc::ClientContext ctx;
      grpc::health::v1::HealthCheckResponse resp;
      const Clock::time_point start = Clock::now();
      const grpc::Status st = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
      const double us = MicrosSince(start);
      if (absl::Status s = Check(st, "Health/Check"); !s.ok()) return s;
      if (keep) floor_us.push_back(us);
    }
    absl::StatusOr<double> handoff = ReleaseAbsent(grpc_transport);
    if (!handoff.ok()) return handoff.status();
    if (keep) handoff_us.push_back(*handoff);
    double us = 0, fwd = 0;
    if (absl::Status st = decoder.Step(&us, &fwd); !st.ok()) return st;
    if (keep) {
      verify_us.push_back(us);
      forward_us.push_back(fwd);
      beyond_us.push_back(us - fwd);
    }
    if (local_decoder.has_value()) {
      handoff = ReleaseAbsent(*local_transport);
      if (!handoff.ok()) return handoff.status();
      if (absl::Status st = local_decoder->Step(&us, &fwd); !st.ok()) return st;
      if (keep) {
        local_handoff_us.push_back(*handoff);
        local_beyond_us.push_back(us - fwd);
      }
    }
  }
  if (absl::Status st = decoder.Restart(); !st.ok()) return st;
  if (local_decoder.has_value()) {
    if (absl::Status st = local_decoder->Restart(); !st.ok()) return st;
  }

  const Summary os = Summarize(os_us), floor = Summarize(floor_us), handoff = Summarize(handoff_us),
                verify = Summarize(verify_us), forward = Summarize(forward_us),
                beyond = Summarize(beyond_us);
  const auto line = [](const char* what, const Summary& s) {
    std::printf("  %-58s median %8.1f us   p10 %8.1f   p90 %8.1f\n", what, s.median, s.p10, s.p90);
  };
  std::printf("worker_rpc_bench: target worker at %s (%s back end), %lld calls of each\n",
              address.c_str(), info.backend().c_str(), static_cast<long long>(*calls));
  line("same-host floor (socketpair ping-pong, no gRPC)", os);
  line("gRPC unary floor (Health/Check, on gRPC's threads)", floor);
  line("+ engine-thread hand-off (Release of an unknown sequence)", handoff);
  line("K = 0 Verify, one decode step: whole call", verify);
  line("  its forward pass (the reply's forward_ns)", forward);
  line("  beyond the forward pass", beyond);
  std::printf(
      "  differences of medians: hand-off %.1f us, codec and runtime bookkeeping %.1f us; gRPC "
      "%.1f us\n",
      handoff.median - floor.median, beyond.median - handoff.median, floor.median);
  std::optional<Summary> local_handoff, local_beyond;
  if (local_decoder.has_value()) {
    local_handoff = Summarize(local_handoff_us);
    local_beyond = Summarize(local_beyond_us);
    std::printf("  over the worker's local socket (%s), no gRPC:\n", info.local_socket().c_str());
    line("  engine-thread call (Release of an unknown sequence)", *local_handoff);
    line("  K = 0 Verify beyond the forward pass", *local_beyond);
  }

  if (const std::string path = flags.Get("json"); !path.empty()) {
    const auto j = [](const Summary& s) {
      return nlohmann::json{{"median_us", s.median}, {"p10_us", s.p10}, {"p90_us", s.p90}};
    };
    nlohmann::json report = {{"target", address},
                             {"backend", info.backend()},
                             {"calls", *calls},
                             {"socketpair_ping_pong", j(os)},
                             {"grpc_floor", j(floor)},
                             {"engine_thread_call", j(handoff)},
                             {"verify_k0", j(verify)},
                             {"verify_k0_forward", j(forward)},
                             {"verify_k0_beyond_forward", j(beyond)}};
    if (local_handoff.has_value()) {
      report["local_socket"] = {{"path", info.local_socket()},
                                {"engine_thread_call", j(*local_handoff)},
                                {"verify_k0_beyond_forward", j(*local_beyond)}};
    }
    std::ofstream(path) << report.dump(2) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  const std::vector<specd::FlagSpec> specs = {
      {"target", "address of a running target worker (host:port or unix:PATH)", "", false, true},
      {"calls", "calls of each kind, after a warm-up", "2000"},
      {"prompt-len", "tokens of the decoded sequence's prompt", "16"},
      {"steps", "tokens decoded per sequence before it restarts", "200"},
      {"json", "also write the figures to this file", ""},
  };
  const absl::StatusOr<specd::Flags> flags =
      specd::Flags::Parse(std::vector<std::string>(argv + 1, argv + argc), specs);
  if (!flags.ok()) {
    std::fprintf(stderr, "worker_rpc_bench: %s\n%s", std::string(flags.status().message()).c_str(),
                 specd::Flags::Usage(specs).c_str());
    return 2;
  }
  if (const absl::Status st = specd::Run(*flags); !st.ok()) {
    std::fprintf(stderr, "worker_rpc_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
