#include "tools/specd/remote_generate.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "services/common/tls.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd::cli {

std::vector<FlagSpec> ClientSecurityFlags(bool with_token) {
  std::vector<FlagSpec> flags = {
      {"tls-ca", "PEM file of the CA certificates to trust: connect over TLS (default: plaintext)",
       ""},
  };
  if (with_token) {
    flags.push_back(
        {"token", "bearer token for a server that requires one (default: $SPECD_TOKEN)", ""});
  }
  return flags;
}

ClientSecurity ClientSecurityFromArgs(const Flags& args) {
  ClientSecurity security;
  security.tls_ca_file = args.Get("tls-ca");
  if (args.Has("token")) {
    security.token = args.Get("token");
  } else if (const char* env = std::getenv("SPECD_TOKEN"); env != nullptr) {
    security.token = env;
  }
  return security;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& server,
                                                           const ClientSecurity& security) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ClientChannelCredentials(security.tls_ca_file);
  if (!credentials.ok()) return credentials.status();
  return grpc::CreateChannel(server, *credentials);
}

int RemoteGenerate(const std::string& server, const ClientSecurity& security,
                   const v1::GenerateRequest& request, double timeout_seconds) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel(server, security);
  if (!channel.ok()) return ReportError("generate", channel.status());
  auto stub = v1::Generation::NewStub(*channel);
  grpc::ClientContext ctx;
  if (!security.token.empty()) ctx.AddMetadata("authorization", "Bearer " + security.token);
  ctx.set_wait_for_ready(true);  // the server may still be loading its workers
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, request);
  v1::GenerateResponse msg;
  v1::Usage usage;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&msg)) {
    if (first == std::chrono::steady_clock::time_point()) first = std::chrono::steady_clock::now();
    std::cout << msg.text() << std::flush;
    if (msg.has_usage()) usage = msg.usage();
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish = msg.finish_reason();
  }
  const grpc::Status status = reader->Finish();
  const auto end = std::chrono::steady_clock::now();
  std::cout << std::endl;
  if (!status.ok()) {
    std::cerr << "specd generate: " << server << ": " << status.error_message() << std::endl;
    return 1;
  }
  const double decode = std::chrono::duration<double>(end - first).count();
  std::string per_pos;
  for (int i = 0; i < usage.accepted_per_position_size(); ++i) {
    per_pos += (i ? " " : "") + std::to_string(usage.accepted_per_position(i));
  }
  std::fprintf(stderr,
               "[%u prompt tokens, %u generated, finish %s; %u rounds, acceptance rate %.3f "
               "(%u/%u drafts; per position: %s); time to first token %.1f ms; %.1f tokens/s]\n",
               usage.prompt_tokens(), usage.completion_tokens(),
               v1::FinishReason_Name(finish).c_str(), usage.rounds(), usage.acceptance_rate(),
               usage.accepted_tokens(), usage.draft_tokens(), per_pos.c_str(),
               1e3 * std::chrono::duration<double>(first - start).count(),
               decode > 0 ? usage.completion_tokens() / decode : 0.0);
  return 0;
}

}  // namespace specd::cli
