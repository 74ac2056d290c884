#include "tools/specd/remote_generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/common/grpc_status.h"
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

absl::Status ApplyRequestFlags(const Flags& args, v1::GenerateRequest* request) {
  absl::StatusOr<int64_t> max_tokens = args.GetInt("max-tokens");
  absl::StatusOr<int64_t> top_k = args.GetInt("top-k");
  absl::StatusOr<double> temperature = args.GetDouble("temperature");
  absl::StatusOr<double> top_p = args.GetDouble("top-p");
  absl::StatusOr<double> min_p = args.GetDouble("min-p");
  for (const absl::Status& st : {max_tokens.status(), top_k.status(), temperature.status(),
                                 top_p.status(), min_p.status()}) {
    if (!st.ok()) return st;
  }
  if (*max_tokens < 0 || *top_k < 0) {
    return absl::InvalidArgumentError("--max-tokens and --top-k must be >= 0");
  }
  request->mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(*max_tokens));
  request->mutable_stopping()->set_ignore_eos(args.GetBool("ignore-eos"));
  if (args.Has("stop")) request->mutable_stopping()->add_stop(args.Get("stop"));
  v1::SamplingParameters* s = request->mutable_sampling();
  s->set_temperature(static_cast<float>(*temperature));
  s->set_top_k(static_cast<int32_t>(*top_k));
  s->set_top_p(static_cast<float>(*top_p));
  s->set_min_p(static_cast<float>(*min_p));
  if (args.Has("seed")) {
    absl::StatusOr<int64_t> seed = args.GetInt("seed");
    if (!seed.ok()) return seed.status();
    s->set_seed(static_cast<uint64_t>(*seed));
  }
  if (args.Has("k")) {
    absl::StatusOr<int64_t> k = args.GetInt("k");
    if (!k.ok()) return k.status();
    if (*k < 0) return absl::InvalidArgumentError("--k must be >= 0");
    request->mutable_speculation()->set_num_speculative_tokens(static_cast<uint32_t>(*k));
  }
  if (args.GetBool("draft-greedy")) {
    request->mutable_speculation()->set_draft_sampling(v1::DRAFT_SAMPLING_GREEDY);
  }
  return absl::OkStatus();
}

absl::Status AwaitServer(grpc::Channel& channel, const std::string& server,
                         const std::string& program, double timeout_seconds) {
  const auto start = std::chrono::system_clock::now();
  const auto deadline =
      start + std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  if (channel.WaitForConnected(std::min(deadline, start + std::chrono::seconds(3)))) {
    return absl::OkStatus();
  }
  if (std::chrono::system_clock::now() < deadline) {
    std::cerr << "specd " << program << ": waiting for " << server << " to accept connections"
              << std::endl;
    if (channel.WaitForConnected(deadline)) return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("cannot reach ", server, " within ", timeout_seconds,
                                             " s (--timeout): is `specd serve` listening there?"));
}

absl::StatusOr<StreamedReply> StreamToStdout(v1::Generation::Stub& stub,
                                             const ClientSecurity& security,
                                             const v1::GenerateRequest& request,
                                             double timeout_seconds) {
  grpc::ClientContext ctx;
  if (!security.token.empty()) ctx.AddMetadata("authorization", "Bearer " + security.token);
  ctx.set_wait_for_ready(true);  // the server may still be loading its workers
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  StreamedReply reply;
  while (reader->Read(&msg)) {
    if (first == std::chrono::steady_clock::time_point()) first = std::chrono::steady_clock::now();
    std::cout << msg.text() << std::flush;
    reply.text += msg.text();
    if (msg.has_usage()) reply.usage = msg.usage();
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) reply.finish = msg.finish_reason();
  }
  const grpc::Status status = reader->Finish();
  const auto end = std::chrono::steady_clock::now();
  if (!status.ok()) return FromGrpcStatus(status);
  const double decode = std::chrono::duration<double>(end - first).count();
  reply.time_to_first_token_ms = 1e3 * std::chrono::duration<double>(first - start).count();
  reply.tokens_per_second = decode > 0 ? reply.usage.completion_tokens() / decode : 0.0;
  return reply;
}

int RemoteGenerate(const std::string& server, const ClientSecurity& security,
                   const v1::GenerateRequest& request, double timeout_seconds,
                   const std::string& echo) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel(server, security);
  if (!channel.ok()) return ReportError("generate", channel.status());
  if (absl::Status st = AwaitServer(**channel, server, "generate", timeout_seconds); !st.ok()) {
    return ReportError("generate", st);
  }
  std::cout << echo << std::flush;
  auto stub = v1::Generation::NewStub(*channel);
  absl::StatusOr<StreamedReply> reply = StreamToStdout(*stub, security, request, timeout_seconds);
  std::cout << std::endl;
  if (!reply.ok()) {
    std::cerr << "specd generate: " << server << ": " << reply.status().message() << std::endl;
    return 1;
  }
  const v1::Usage& usage = reply->usage;
  std::string per_pos;
  for (int i = 0; i < usage.accepted_per_position_size(); ++i) {
    per_pos += (i ? " " : "") + std::to_string(usage.accepted_per_position(i));
  }
  std::fprintf(stderr,
               "[%u prompt tokens, %u generated, finish %s; %u rounds, acceptance rate %.3f "
               "(%u/%u drafts; per position: %s); time to first token %.1f ms; %.1f tokens/s]\n",
               usage.prompt_tokens(), usage.completion_tokens(),
               v1::FinishReason_Name(reply->finish).c_str(), usage.rounds(),
               usage.acceptance_rate(), usage.accepted_tokens(), usage.draft_tokens(),
               per_pos.c_str(), reply->time_to_first_token_ms, reply->tokens_per_second);
  return 0;
}

}  // namespace specd::cli
