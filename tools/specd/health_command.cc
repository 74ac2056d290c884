// `specd health --server ADDR`: one grpc.health.v1.Health/Check call, exit 0 when the server
// answers SERVING. Container health checks run it, so it stays small and prints one line.
//
// The two health messages are tiny and frozen by the gRPC health protocol (a request holding only
// `string service = 1` and a response holding only `ServingStatus status = 1`), so the call goes
// through the generic stub with hand-encoded bytes rather than pulling generated stubs into the
// CLI.
#include <chrono>
#include <cstdint>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "tools/specd/command.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] = "exit 0 when a specd process answers gRPC health SERVING";
constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr int kServing = 1;  // grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING

// HealthCheckRequest{service}: field 1, wire type 2 (length-delimited).
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);
  for (uint64_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  return out + service;
}

// HealthCheckResponse.status: field 1, wire type 0 (varint); absent means UNKNOWN (0).
absl::StatusOr<int> DecodeStatus(const std::string& bytes) {
  if (bytes.empty()) return 0;
  if (static_cast<uint8_t>(bytes[0]) != 0x08) {
    return absl::DataLossError("the health response is not a grpc.health.v1 HealthCheckResponse");
  }
  uint64_t value = 0;
  for (size_t i = 1, shift = 0; i < bytes.size() && shift < 64; ++i, shift += 7) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return static_cast<int>(value);
  }
  return absl::DataLossError("the health response's status field is truncated");
}

absl::StatusOr<int> Check(const std::string& server, const std::string& service,
                          double timeout_seconds) {
  const auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, kCheckMethod, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--server ", server, ": health check failed: ", status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return absl::DataLossError(absl::StrCat("--server ", server, ": unreadable health response"));
  }
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return DecodeStatus(bytes);
}

int RunHealth(const std::vector<std::string>& argv) {
  const std::vector<Args::Flag> flags = {
      {"server", "address host:port of a specd coordinator or worker", "", false, true},
      {"service", "health service name; empty = the whole server", ""},
      {"timeout", "seconds to wait for the answer", "5"},
  };
  int exit_code = 0;
  std::optional<Args> args = ParseOrExit("health", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  absl::StatusOr<double> timeout = args->GetDouble("timeout");
  if (!timeout.ok()) return ReportError("health", timeout.status());
  if (!(*timeout > 0 && *timeout <= 3600)) {
    return ReportError("health", absl::InvalidArgumentError(absl::StrCat(
                                     "--timeout must be in (0, 3600] seconds, got ", *timeout)));
  }
  absl::StatusOr<int> status = Check(args->Get("server"), args->Get("service"), *timeout);
  if (!status.ok()) return ReportError("health", status.status());
  if (*status != kServing) {
    std::cout << args->Get("server") << ": NOT_SERVING (status " << *status << ")" << std::endl;
    return 1;
  }
  std::cout << args->Get("server") << ": SERVING" << std::endl;
  return 0;
}

const CommandRegistration kRegistration({"health", kSummary, RunHealth});

}  // namespace
}  // namespace specd::cli
