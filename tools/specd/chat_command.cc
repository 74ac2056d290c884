// `specd chat --server ADDR`: a conversation with a served model over the gRPC API. Each line of
// stdin is a user turn; the server renders the whole conversation so far with its chat template
// and the reply streams to stdout, then joins the conversation as the assistant's turn.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "tools/specd/command.h"
#include "tools/specd/remote_generate.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] =
    "Chat with a running server: one user turn per line of stdin, each reply streamed.\n"
    "/reset starts a new conversation, /exit (or end of input) ends.\n"
    "  specd chat --server 127.0.0.1:50051 --system \"You are terse.\"";

// Writes the conversation as the gRPC API's Chat in JSON ({"messages": [{"role", "content"}]}),
// which the HTTP API's `messages` also takes.
absl::Status SaveTranscript(const std::string& path, const v1::Chat& chat) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(chat, &json, options).ok()) {
    return absl::InternalError("the conversation cannot be written as JSON");
  }
  std::ofstream out(path, std::ios::trunc);
  out << json;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("--transcript: cannot write ", path));
  return absl::OkStatus();
}

v1::Chat NewConversation(const std::string& system) {
  v1::Chat chat;
  if (!system.empty()) {
    v1::ChatMessage* m = chat.add_messages();
    m->set_role("system");
    m->set_content(system);
  }
  return chat;
}

int RunChat(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = {
      {"server", "address of a running `specd serve`", ""},
      {"system", "a system message that opens the conversation", ""},
      {"transcript", "file the conversation is written to (JSON) after every reply", ""},
      {"max-tokens", "tokens per reply at most", "512"},
      {"temperature", "0 = greedy", "0"},
      {"top-k", "0 = off", "0"},
      {"top-p", "nucleus mass in (0, 1]", "1"},
      {"min-p", "min-p filter in [0, 1]", "0"},
      {"seed", "sampling seed (unset lets the server pick)", ""},
      {"k", "num_speculative_tokens (default: the server's)", ""},
      {"draft-greedy", "the draft proposes its argmax", "", true},
      {"stop", "a stop string", ""},
      {"ignore-eos", "do not stop at the model's EOS tokens", "", true},
      {"timeout", "seconds before a reply is abandoned", "600"},
  };
  for (FlagSpec& f : ClientSecurityFlags(/*with_token=*/true)) flags.push_back(std::move(f));
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("chat", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  auto fail = [](const absl::Status& st) { return ReportError("chat", st); };
  if (!args->Has("server")) return fail(absl::InvalidArgumentError("--server is required"));
  v1::GenerateRequest base;
  if (absl::Status st = ApplyRequestFlags(*args, &base); !st.ok()) return fail(st);
  absl::StatusOr<double> timeout = args->GetDouble("timeout");
  if (!timeout.ok()) return fail(timeout.status());
  const ClientSecurity security = ClientSecurityFromArgs(*args);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(args->Get("server"), security);
  if (!channel.ok()) return fail(channel.status());
  if (absl::Status st = AwaitServer(**channel, args->Get("server"), "chat", *timeout); !st.ok()) {
    return fail(st);
  }
  const std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(*channel);

  // Prompts only when a person types: piped input gets replies and nothing else on stdout.
  const bool interactive = isatty(STDIN_FILENO) != 0;
  v1::Chat chat = NewConversation(args->Get("system"));
  std::string line;
  int turn = 0;
  while (true) {
    if (interactive) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      chat = NewConversation(args->Get("system"));
      continue;
    }
    v1::ChatMessage* user = chat.add_messages();
    user->set_role("user");
    user->set_content(line);
    v1::GenerateRequest request = base;
    *request.mutable_chat() = chat;
    absl::StatusOr<StreamedReply> reply = StreamToStdout(*stub, security, request, *timeout);
    if (!reply.ok()) {
      std::cerr << "specd chat: " << args->Get("server") << ": " << reply.status().message()
                << std::endl;
      return 1;
    }
    std::cout << std::endl;
    v1::ChatMessage* assistant = chat.add_messages();
    assistant->set_role("assistant");
    assistant->set_content(reply->text);
    ++turn;
    std::fprintf(stderr,
                 "[turn %d: %u prompt tokens, %u generated, finish %s; acceptance rate %.3f; "
                 "%.1f tokens/s]\n",
                 turn, reply->usage.prompt_tokens(), reply->usage.completion_tokens(),
                 v1::FinishReason_Name(reply->finish).c_str(), reply->usage.acceptance_rate(),
                 reply->tokens_per_second);
    if (args->Has("transcript")) {
      if (absl::Status st = SaveTranscript(args->Get("transcript"), chat); !st.ok()) {
        return fail(st);
      }
    }
  }
  return 0;
}

const CommandRegistration kRegistration({"chat", kSummary, RunChat});

}  // namespace
}  // namespace specd::cli
