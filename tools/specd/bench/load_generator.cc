#include "tools/specd/bench/load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace specd::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

RequestOutcome RunRequest(v1::Generation::StubInterface& stub, const v1::GenerateRequest& request,
                          int64_t index, double timeout_seconds, Clock::time_point run_start,
                          const std::function<void()>& on_first_tokens) {
  RequestOutcome out;
  out.index = index;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  out.start_s = SecondsSince(run_start);
  std::unique_ptr<grpc::ClientReaderInterface<v1::GenerateResponse>> reader =
      stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    const double now = SecondsSince(run_start);
    if (msg.token_ids_size() > 0) {
      if (out.message_s.empty() && on_first_tokens) on_first_tokens();
      out.message_s.push_back(now);
      out.message_tokens.push_back(msg.token_ids_size());
      out.output_tokens += msg.token_ids_size();
      out.token_ids.insert(out.token_ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    }
    if (msg.has_usage()) {
      out.has_usage = true;
      out.usage = msg.usage();
    }
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED)
      out.finish_reason = msg.finish_reason();
  }
  const grpc::Status status = reader->Finish();
  out.end_s = SecondsSince(run_start);
  if (!status.ok()) {
    // gRPC and Abseil share the code numbering.
    out.status = absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                              absl::StrCat("request ", index, ": ", status.error_message()));
  }
  return out;
}

absl::StatusOr<Arrival> ParseArrival(const std::string& name) {
  if (name == "poisson") return Arrival::kPoisson;
  if (name == "fixed") return Arrival::kFixedInterval;
  return absl::InvalidArgumentError(
      absl::StrCat("--arrival must be poisson or fixed, got '", name, "'"));
}

std::vector<double> ArrivalOffsets(int64_t n, double rate, Arrival arrival, uint64_t seed) {
  std::vector<double> offsets(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (rate <= 0) return offsets;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < offsets.size(); ++i) {
    offsets[i] = offsets[i - 1] + (arrival == Arrival::kPoisson ? gap(rng) : 1.0 / rate);
  }
  return offsets;
}

LoadRun RunLoad(v1::Generation::StubInterface& stub,
                const std::vector<v1::GenerateRequest>& requests, const LoadOptions& options,
                const std::function<void()>& on_done) {
  return RunLoad(
      [&stub](const v1::GenerateRequest& request, int64_t index, double timeout_seconds,
              Clock::time_point run_start) {
        return RunRequest(stub, request, index, timeout_seconds, run_start);
      },
      requests, options, on_done);
}

LoadRun RunLoad(const SendOne& send, const std::vector<v1::GenerateRequest>& requests,
                const LoadOptions& options, const std::function<void()>& on_done) {
  const int64_t n = static_cast<int64_t>(requests.size());
  const std::vector<double> offsets =
      ArrivalOffsets(n, options.rate, options.arrival, options.arrival_seed);
  LoadRun run;
  run.outcomes.resize(requests.size());
  std::atomic<int64_t> next{0};
  std::mutex done_mu;
  const Clock::time_point start = Clock::now();
  auto stream = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      const size_t at = static_cast<size_t>(i);
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(offsets[at])));
      run.outcomes[at] = send(requests[at], i, options.timeout_seconds, start);
      const std::lock_guard<std::mutex> lock(done_mu);
      if (on_done) on_done();
    }
  };
  std::vector<std::thread> threads;
  const int64_t streams = std::clamp<int64_t>(options.streams, 1, std::max<int64_t>(n, 1));
  threads.reserve(static_cast<size_t>(streams));
  for (int64_t s = 0; s < streams; ++s) threads.emplace_back(stream);
  for (std::thread& t : threads) t.join();
  for (const RequestOutcome& o : run.outcomes) run.wall_s = std::max(run.wall_s, o.end_s);
  return run;
}

}  // namespace specd::bench
