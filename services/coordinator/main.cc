// specd-coordinator: the public gRPC API over a draft and a target worker. It owns every request,
// runs accept/reject, and is NOT_SERVING (health) until both workers are reachable and agree on
// the vocabulary.
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/log_line.h"
#include "base/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/common/listen_address.h"
#include "services/common/service_process.h"
#include "services/common/tls.h"
#include "services/common/work_queue.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator_flags.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/grpc_worker.h"
#include "services/coordinator/http/http_server.h"
#include "services/coordinator/http/openai_api.h"
#include "services/coordinator/tool_calls.h"

namespace specd {
namespace {

constexpr char kProgram[] = "specd-coordinator";

std::vector<FlagSpec> CoordinatorFlags() {
  std::vector<FlagSpec> flags = {
      {"listen", "public gRPC address host:port (port 0 picks a free one) or unix:PATH",
       "127.0.0.1:50051"},
      {"target", "target worker address host:port", "", false, true},
      {"draft",
       "draft worker address host:port; without one, model drafting is plain decoding (K = 0)", ""},
      {"metrics-port", "port of the Prometheus /metrics endpoint; 0 = a free one, -1 = off", "0"},
      {"http-listen",
       "also serve the OpenAI-compatible HTTP API on host:port (same TLS, token and limits as "
       "the gRPC API); port 0 picks a free one; unset = off",
       ""},
  };
  const std::vector<FlagSpec> serving = CoordinatorServingFlags();
  flags.insert(flags.end(), serving.begin(), serving.end());
  return flags;
}

int Fail(const absl::Status& st) {
  LogLine(kProgram) << st.message();
  return 1;
}

// A bad flag: its message, and the exit code of a usage error.
int FlagError(const absl::Status& st) {
  LogLine(kProgram) << st.message();
  return 2;
}

// How the public API is secured and bounded (issue 9).
struct PublicApiConfig {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls = false;
  PublicApiOptions options;
  int64_t max_request_bytes = 0;
  int64_t max_prompt_tokens = 0;
  int64_t max_new_tokens_limit = 0;
  int64_t prep_threads = 0;
};

absl::StatusOr<PublicApiConfig> ReadPublicApiConfig(const Flags& flags) {
  PublicApiConfig c;
  const std::string cert = flags.Get("tls-cert");
  const std::string key = flags.Get("tls-key");
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both for TLS, or neither for plaintext");
  }
  c.tls = !cert.empty();
  if (c.tls) {
    SPECD_ASSIGN_OR_RETURN(c.credentials, TlsServerCredentials(cert, key));
  } else {
    c.credentials = grpc::InsecureServerCredentials();
  }
  SPECD_ASSIGN_OR_RETURN(c.options.auth, BearerTokenAuth::Load(flags.Get("auth-token-file"),
                                                               std::getenv("SPECD_AUTH_TOKEN")));
  // gRPC takes an int; 1 KiB is far below any real request, 1 GiB far above.
  SPECD_ASSIGN_OR_RETURN(c.max_request_bytes, flags.GetInt("max-request-bytes", 1024, 1 << 30));
  SPECD_ASSIGN_OR_RETURN(c.max_prompt_tokens, flags.GetInt("max-prompt-tokens", 0, 1 << 30));
  SPECD_ASSIGN_OR_RETURN(c.max_new_tokens_limit, flags.GetInt("max-new-tokens-limit", 0, 1 << 30));
  SPECD_ASSIGN_OR_RETURN(c.options.max_streams_per_connection,
                         flags.GetInt("max-streams-per-connection", 0, 1 << 20));
  SPECD_ASSIGN_OR_RETURN(c.prep_threads, flags.GetInt("prep-threads", 1, 256));
  return c;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// Graceful shutdown: health turns NOT_SERVING and new requests UNAVAILABLE (HTTP 503) on both
// APIs while the open ones get `drain_seconds` to finish; then the rest end with a status that
// says why. A second SIGTERM or SIGINT ends the drain period at once.
void Drain(Scheduler& scheduler, GenerationService& service, grpc::Server& server,
           http::OpenAiApi* http_api, http::HttpServer* http_server, WorkQueue& prep,
           const sigset_t& stop_signals, int64_t drain_seconds) {
  // Workers signalled with the coordinator go away during the drain; that is no outage.
  scheduler.BeginShutdown();
  // Admission stops first, so a client that sees NOT_SERVING also gets UNAVAILABLE.
  service.StopAdmitting();
  if (http_api != nullptr) http_api->StopAdmitting();
  server.GetHealthCheckService()->SetServingStatus(false);
  auto open = [&] {
    return service.open_streams() + (http_api != nullptr ? http_api->open_requests() : 0);
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(static_cast<double>(drain_seconds));
  bool interrupted = false;
  while (open() > 0 && absl::Now() < deadline) {
    const timespec poll = {0, 50'000'000};
    if (sigtimedwait(&stop_signals, nullptr, &poll) > 0) {
      interrupted = true;
      break;
    }
    service.CancelAbandoned();
  }
  if (open() > 0) {
    const std::string why =
        interrupted ? std::string("the coordinator was stopped by a second signal")
                    : absl::StrCat("the coordinator shut down after its drain period of ",
                                   drain_seconds, " s (--drain-seconds)");
    const std::string message =
        absl::StrCat(why, " before this request finished; retry it on another replica");
    int64_t ended = service.EndOpenStreams(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
    if (http_api != nullptr) ended += http_api->EndOpenRequests(absl::UnavailableError(message));
    LogLine(kProgram) << (interrupted ? "second signal" : "drain period over") << "; ended "
                      << ended << " unfinished request(s)";
  }
  // The streams just ended get a moment to deliver their last messages.
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server.Wait();
  // What the APIs queued is answered while the HTTP server can still deliver it.
  prep.Stop();
  if (http_server != nullptr) http_server->Stop();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--", flag, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

v1::ModelInfo ModelInfoOf(const worker::v1::InfoResponse& info) {
  v1::ModelInfo m;
  m.set_name(info.model_name());
  m.set_vocab_size(info.vocab_size());
  m.set_max_seq_len(info.max_seq_len());
  m.set_num_layers(info.num_layers());
  return m;
}

int Run(int argc, char** argv) {
  const sigset_t stop_signals = StartServiceProcess();

  const std::vector<FlagSpec> specs = CoordinatorFlags();
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: " << kProgram << " --target ADDR [--draft ADDR] [flags]\n"
                << "The specd public API over a draft and a target worker.\n\n"
                << Flags::Usage(specs);
      return 0;
    }
  }
  absl::StatusOr<Flags> flags = Flags::Parse(args, specs);
  if (!flags.ok()) {
    std::cerr << kProgram << ": " << flags.status().message() << "\n\n" << Flags::Usage(specs);
    return 2;
  }
  int64_t n[8];
  const char* int_flags[8] = {"default-k",           "max-k",        "num-candidates",
                              "max-running",         "max-queued",   "default-max-new-tokens",
                              "worker-wait-seconds", "drain-seconds"};
  const int64_t maxes[8] = {64, 64, 64, 4096, 1 << 20, 1 << 20, 86400, 3600};
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<int64_t> v = flags->GetInt(int_flags[i], 0, maxes[i]);
    if (!v.ok()) {
      return FlagError(v.status());
    }
    n[i] = *v;
  }
  const auto [default_k, max_k, num_candidates, max_running, max_queued, default_max_new,
              wait_seconds, drain_seconds] =
      std::tuple{n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]};
  const absl::StatusOr<int64_t> metrics_port = flags->GetInt("metrics-port", -1, 65535);
  const absl::StatusOr<int64_t> prefill_chunk = flags->GetInt("prefill-chunk", 0, 1 << 24);
  for (const absl::Status& st : {metrics_port.status(), prefill_chunk.status()}) {
    if (!st.ok()) {
      return FlagError(st);
    }
  }
  if (default_k > max_k) {
    LogLine(kProgram) << "--default-k (" << default_k << ") exceeds --max-k (" << max_k << ")";
    return 2;
  }
  const absl::StatusOr<bool> prefix_sharing = flags->GetOnOff("prefix-sharing");
  if (!prefix_sharing.ok()) return FlagError(prefix_sharing.status());
  const std::string draft_method = flags->Get("draft-method");
  if (draft_method != "model" && draft_method != "ngram") {
    LogLine(kProgram) << "--draft-method must be model or ngram, got '" << draft_method << "'";
    return 2;
  }
  NgramOptions ngram;
  EgagOptions egag;
  {
    const absl::StatusOr<int64_t> min_n = flags->GetInt("ngram-min", 1, 64);
    const absl::StatusOr<int64_t> max_n = flags->GetInt("ngram-max", 1, 64);
    const absl::StatusOr<double> beta = flags->GetDouble("egag-ema-beta");
    const absl::StatusOr<double> threshold = flags->GetDouble("egag-threshold");
    const absl::StatusOr<int64_t> min_tokens = flags->GetInt("egag-min-tokens", 1, 64);
    absl::Status st = min_n.status();
    for (const absl::Status& s :
         {max_n.status(), beta.status(), threshold.status(), min_tokens.status()}) {
      if (st.ok()) st = s;
    }
    if (st.ok()) {
      ngram = {static_cast<int32_t>(*min_n), static_cast<int32_t>(*max_n)};
      egag = {*beta, *threshold, static_cast<int32_t>(*min_tokens)};
      st = ValidateNgramOptions(ngram);
    }
    if (st.ok()) st = ValidateEgagOptions(egag);
    if (!st.ok()) {
      return FlagError(st);
    }
  }
  absl::StatusOr<PublicApiConfig> api = ReadPublicApiConfig(*flags);
  if (!api.ok()) {
    return FlagError(api.status());
  }
  // Read now, so that a wrong path fails before anything starts.
  std::optional<std::string> chat_template;
  if (!flags->Get("chat-template").empty()) {
    absl::StatusOr<std::string> source = ReadTextFile("chat-template", flags->Get("chat-template"));
    if (!source.ok()) {
      return FlagError(source.status());
    }
    // Its syntax too; the special tokens come with the target's tokenizer_config.json later.
    if (absl::StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::FromSource(*source, "");
        !t.ok()) {
      LogLine(kProgram) << "--chat-template: " << t.status().message();
      return 2;
    }
    chat_template = *std::move(source);
  }
  if (api->max_new_tokens_limit > 0 && default_max_new > api->max_new_tokens_limit) {
    LogLine(kProgram) << "--default-max-new-tokens (" << default_max_new
                      << ") exceeds --max-new-tokens-limit (" << api->max_new_tokens_limit << ")";
    return 2;
  }

  const absl::StatusOr<ListenAddress> listen = ParseListenAddress("listen", flags->Get("listen"));
  if (!listen.ok()) {
    return FlagError(listen.status());
  }
  const std::string& host = listen->host;
  // Declared before everything it observes, so it outlives them.
  CoordinatorMetrics metrics;
  // Printed before "listening on", as the workers do, so launchers that stop reading at the
  // address have seen both.
  if (*metrics_port >= 0) {
    const std::string& metrics_host = listen->metrics_host;
    absl::StatusOr<int> mport = metrics.Serve(metrics_host, static_cast<int>(*metrics_port));
    if (!mport.ok()) return Fail(mport.status());
    std::cout << "metrics on " << metrics_host << ":" << *mport << std::endl;
  }
  // Where both APIs validate and tokenize requests; stopped by the drain.
  WorkQueue prep(static_cast<int>(api->prep_threads));
  // The HTTP API, when asked for, answers 503 until the workers are up, as gRPC health does.
  std::unique_ptr<http::OpenAiApi> http_api;
  std::unique_ptr<http::HttpServer> http_server;
  if (!flags->Get("http-listen").empty()) {
    http::OpenAiApiOptions options;
    options.auth = api->options.auth;
    http_api = std::make_unique<http::OpenAiApi>(std::move(options), prep);
    http::HttpServerOptions server_options;
    server_options.listen = flags->Get("http-listen");
    server_options.tls_cert = flags->Get("tls-cert");
    server_options.tls_key = flags->Get("tls-key");
    server_options.max_body_bytes = api->max_request_bytes;
    absl::StatusOr<std::unique_ptr<http::HttpServer>> started = http::HttpServer::Start(
        server_options, [api = http_api.get()](std::shared_ptr<http::HttpExchange> exchange) {
          api->Handle(std::move(exchange));
        });
    if (!started.ok()) return Fail(started.status());
    http_server = *std::move(started);
    const std::string http_listen = flags->Get("http-listen");
    std::cout << "http on " << http_listen.substr(0, http_listen.rfind(':')) << ":"
              << http_server->port() << std::endl;
  }
  // Serve first (NOT_SERVING), so health checks answer while the workers load.
  GenerationService service(api->options, prep);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  listen->AddTo(builder, api->credentials, &port);
  // A bigger request is refused by gRPC with RESOURCE_EXHAUSTED before any handler sees it.
  builder.SetMaxReceiveMessageSize(static_cast<int>(api->max_request_bytes));
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    // gRPC checks the certificate and key only here, and logs which one it rejected.
    return Fail(absl::UnavailableError(absl::StrCat(
        listen->CannotListen(),
        api->tls ? ", or --tls-cert and --tls-key are not a certificate chain and its private key"
                 : "")));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(false);
  std::cout << "listening on " << listen->Bound(port) << std::endl;

  const absl::Duration wait = absl::Seconds(static_cast<double>(wait_seconds));
  const absl::StatusOr<int64_t> call_timeout_s =
      flags->GetInt("worker-call-timeout-seconds", 1, 86400);
  const absl::StatusOr<int64_t> unavailable_s =
      flags->GetInt("worker-unavailable-seconds", 0, 86400);
  for (const absl::Status& st : {call_timeout_s.status(), unavailable_s.status()}) {
    if (!st.ok()) {
      return FlagError(st);
    }
  }
  const absl::Duration call_timeout = absl::Seconds(static_cast<double>(*call_timeout_s));
  const absl::StatusOr<bool> local_sockets = flags->GetOnOff("worker-local-sockets");
  if (!local_sockets.ok()) return FlagError(local_sockets.status());
  absl::StatusOr<std::unique_ptr<GrpcWorker>> target = GrpcWorker::Connect(
      GrpcWorker::Role::kTarget, flags->Get("target"), wait, call_timeout, *local_sockets);
  if (!target.ok()) return Fail(target.status());
  std::unique_ptr<GrpcWorker> draft;
  if (!flags->Get("draft").empty()) {
    absl::StatusOr<std::unique_ptr<GrpcWorker>> d = GrpcWorker::Connect(
        GrpcWorker::Role::kDraft, flags->Get("draft"), wait, call_timeout, *local_sockets);
    if (!d.ok()) return Fail(d.status());
    draft = *std::move(d);
  }
  (*target)->SetMetrics(&metrics);
  if (draft != nullptr) draft->SetMetrics(&metrics);
  const worker::v1::InfoResponse& ti = (*target)->info();
  if (draft != nullptr) {
    const worker::v1::InfoResponse& di = draft->info();
    if (di.vocab_size() != ti.vocab_size() ||
        di.tokenizer_fingerprint() != ti.tokenizer_fingerprint()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "the draft worker's vocabulary differs from the target's (vocab ", di.vocab_size(),
          " vs ", ti.vocab_size(), ", tokenizer ", di.tokenizer_fingerprint().substr(0, 12), " vs ",
          ti.tokenizer_fingerprint().substr(0, 12),
          "); speculative decoding needs one tokenizer")));
    }
  }

  // The tokenizer comes from the target worker, so the coordinator needs no model volume.
  std::unique_ptr<Tokenizer> tokenizer;
  const auto& files = ti.tokenizer_files();
  if (files.contains("tokenizer.json")) {
    auto text = [&](const char* name) {
      const auto it = files.find(name);
      return it == files.end() ? std::string() : it->second;
    };
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(
        text("tokenizer.json"), text("tokenizer_config.json"), text("generation_config.json"));
    if (!tok.ok()) return Fail(tok.status());
    tokenizer = *std::move(tok);
  }
  // Chat input needs a tokenizer and a template; the model's own template that cannot be
  // loaded only refuses chat requests (with the reason), an unloadable --chat-template is fatal.
  std::unique_ptr<ChatPrompt> chat;
  if (tokenizer != nullptr) {
    const auto config = files.find("tokenizer_config.json");
    absl::StatusOr<ChatPrompt> loaded = ChatPrompt::Load(
        config == files.end() ? std::string_view() : std::string_view(config->second),
        chat_template);
    if (!loaded.ok()) return Fail(loaded.status());
    chat = std::make_unique<ChatPrompt>(*std::move(loaded));
    if (!chat->available()) {
      LogLine(kProgram) << "chat requests will be refused: "
                        << chat->unavailable_reason().message();
    }
  } else if (chat_template.has_value()) {
    return Fail(absl::FailedPreconditionError(
        "--chat-template: the target model has no tokenizer.json to encode a conversation with"));
  }
  std::vector<int32_t> eos;
  if (tokenizer != nullptr) {
    eos = tokenizer->eos_ids();
  } else {
    eos.assign(ti.eos_token_ids().begin(), ti.eos_token_ids().end());
  }

  ServingState state;
  state.tokenizer = tokenizer.get();
  state.chat = chat.get();
  state.limits.vocab_size = ti.vocab_size();
  state.limits.max_seq_len =
      draft ? std::min(ti.max_seq_len(), draft->info().max_seq_len()) : ti.max_seq_len();
  state.limits.default_max_new_tokens = default_max_new;
  state.limits.default_num_speculative_tokens = static_cast<int32_t>(default_k);
  state.limits.max_num_speculative_tokens = static_cast<int32_t>(max_k);
  state.limits.has_draft = draft != nullptr;
  state.limits.default_draft_method =
      draft_method == "ngram" ? DraftMethod::kNgram : DraftMethod::kModel;
  state.limits.default_egag = flags->GetBool("egag");
  state.limits.max_prompt_tokens = api->max_prompt_tokens;
  state.limits.max_new_tokens_limit = api->max_new_tokens_limit;
  SchedulerOptions so;
  so.max_running = max_running;
  so.max_queued = max_queued;
  so.max_seq_len = state.limits.max_seq_len;
  so.num_candidates = static_cast<int32_t>(num_candidates);
  so.prefill_chunk = *prefill_chunk;
  so.target_pass_tokens = ti.max_pass_tokens();
  if (draft) so.draft_pass_tokens = draft->info().max_pass_tokens();
  so.eos_token_ids = eos;
  so.ngram = ngram;
  so.egag = egag;
  so.worker_unavailable_timeout = absl::Seconds(static_cast<double>(*unavailable_s));
  so.on_worker_event = [](const std::string& event) { LogLine(kProgram) << event; };
  so.on_round = [&metrics](const RoundPhaseTimes& t) {
    metrics.OnRoundPhase(CoordinatorMetrics::Phase::kDraft, t.draft);
    metrics.OnRoundPhase(CoordinatorMetrics::Phase::kVerify, t.verify);
    metrics.OnRoundPhase(CoordinatorMetrics::Phase::kAccept, t.accept);
    metrics.OnRoundPhase(CoordinatorMetrics::Phase::kTruncate, t.truncate);
    metrics.OnRoundPhase(CoordinatorMetrics::Phase::kOverhead,
                         t.round - t.draft_forward - t.verify_forward);
  };
  so.on_k_choice = [&metrics](const KChoice& choice, double alpha) {
    metrics.OnKChoice(choice.k, KChoiceReasonName(choice.reason), alpha);
  };
  so.on_draft_length = [&metrics](int32_t k, bool entropy_stopped) {
    metrics.OnDraftLength(k, entropy_stopped);
  };
  so.on_deferred = [&metrics](int64_t sequences) { metrics.OnDeferred(sequences); };
  so.prefix_sharing = *prefix_sharing;
  so.prefix_block_size = ti.prefix_caching() ? ti.kv_block_size() : 0;
  so.prefix_pool_blocks = ti.kv_total_blocks();
  so.on_prefix_wait = [&metrics](int64_t sequences) { metrics.OnPrefixWait(sequences); };
  using MetricsWorker = CoordinatorMetrics::Worker;
  metrics.SetWorkerUp(MetricsWorker::kTarget, true);
  if (draft) metrics.SetWorkerUp(MetricsWorker::kDraft, true);
  so.on_worker_up = [&metrics](bool target, bool up) {
    metrics.SetWorkerUp(target ? MetricsWorker::kTarget : MetricsWorker::kDraft, up);
  };
  so.on_worker_restart = [&metrics](bool target) {
    metrics.OnWorkerRestart(target ? MetricsWorker::kTarget : MetricsWorker::kDraft);
  };
  // Without a draft worker every request runs with K = 0 and never calls it; the target stands
  // in so the scheduler always has two workers.
  WorkerApi& draft_api = draft ? static_cast<WorkerApi&>(*draft) : **target;
  Scheduler scheduler(draft_api, **target, tokenizer.get(), so);
  state.scheduler = &scheduler;
  state.metrics = &metrics;
  metrics.SetQueueSource([&scheduler] { return scheduler.running(); },
                         [&scheduler] { return scheduler.waiting(); });
  *state.info.mutable_target() = ModelInfoOf(ti);
  if (draft) *state.info.mutable_draft() = ModelInfoOf(draft->info());
  const bool drafts = draft != nullptr || state.limits.default_draft_method == DraftMethod::kNgram;
  state.info.set_default_num_speculative_tokens(static_cast<uint32_t>(drafts ? default_k : 0));
  state.info.set_default_draft_method(state.limits.default_draft_method == DraftMethod::kNgram
                                          ? v1::DRAFT_METHOD_NGRAM
                                          : v1::DRAFT_METHOD_MODEL);
  state.info.set_default_egag(state.limits.default_egag);
  state.info.set_max_num_speculative_tokens(static_cast<uint32_t>(max_k));
  state.info.set_default_max_new_tokens(static_cast<uint32_t>(default_max_new));
  state.info.set_max_running_requests(static_cast<uint32_t>(max_running));
  state.info.set_max_queued_requests(static_cast<uint32_t>(max_queued));
  state.info.mutable_eos_token_ids()->Add(eos.begin(), eos.end());
  state.info.set_version("0.1.0");
  // The target directory's name, as the worker reports it, unless the operator names it.
  std::string served_name = flags->Get("served-model-name");
  if (served_name.empty()) served_name = ti.model_name().empty() ? "model" : ti.model_name();
  state.info.set_served_model_name(served_name);
  state.info.set_has_chat_template(chat != nullptr && chat->available());
  if (chat != nullptr && chat->available() && chat->takes_tools()) {
    state.info.set_takes_tools(true);
    state.info.set_tool_call_format(ToolCallFormatName(chat->tool_call_format()));
  }
  service.SetServing(&state);
  if (http_api != nullptr) http_api->SetServing(&state);
  health->SetServingStatus(true);
  // What `specd serve` waits for before it announces the address.
  std::cout << "serving on " << listen->Bound(port) << std::endl;
  // Which transport each worker's round calls take: the same-host socket, or gRPC.
  const auto via = [](const GrpcWorker& w) {
    return w.UsesLocalSocket() ? absl::StrCat(" via ", w.info().local_socket()) : std::string();
  };
  LogLine(kProgram) << "serving on " << listen->Bound(port) << " (target " << flags->Get("target")
                    << via(**target)
                    << (draft ? absl::StrCat(", draft ", flags->Get("draft"), via(*draft))
                              : std::string(", no draft"))
                    << ", drafting by " << draft_method << "; " << (api->tls ? "TLS" : "plaintext")
                    << ", " << (api->options.auth.enabled() ? "bearer token required" : "no token")
                    << (http_server != nullptr
                            ? absl::StrCat("; HTTP API on port ", http_server->port(),
                                           " as model '", state.info.served_model_name(), "'")
                            : std::string())
                    << ")";
  if (!api->tls && !api->options.auth.enabled() && !IsLoopback(host)) {
    LogLine(kProgram) << "warning: " << host
                      << " is not loopback and the API has neither TLS nor a token; anyone who can "
                         "reach it can generate (see --tls-cert, --auth-token-file)";
  }

  int signal_number = 0;
  bool serving = true;  // what health says
  while (signal_number <= 0) {
    const timespec poll = {0, 100'000'000};
    signal_number = sigtimedwait(&stop_signals, nullptr, &poll);
    service.CancelAbandoned();
    // NOT_SERVING while the target worker is down, so load balancers route around it; requests
    // still wait for it (--worker-unavailable-seconds), as crash replay needs.
    if (const absl::Status target = scheduler.TargetStatus(); target.ok() != serving) {
      serving = target.ok();
      health->SetServingStatus(serving);
      LogLine(kProgram) << "health: " << (serving ? "SERVING" : "NOT_SERVING") << " ("
                        << (serving ? std::string("the target worker is back")
                                    : std::string(target.message()))
                        << ")";
    }
  }
  LogLine(kProgram) << (signal_number == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining (up to "
                    << drain_seconds << " s)";
  Drain(scheduler, service, *server, http_api.get(), http_server.get(), prep, stop_signals,
        drain_seconds);
  LogLine(kProgram) << "stopped";
  // A scrape after this point must not read the scheduler, which goes before the metrics do.
  metrics.SetQueueSource(nullptr, nullptr);
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Run(argc, argv); }
