#include "services/common/worker_main.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/log_line.h"
#include "base/status_macros.h"
#include "common/engine/backend_self_check.h"
#include "common/engine/llama_engine.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/protocol/worker_protocol.h"
#include "common/tokenizer/token_ranking.h"
#include "common/tokenizer/tokenizer.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/common/engine_thread.h"
#include "services/common/listen_address.h"
#include "services/common/local_socket_server.h"
#include "services/common/service_process.h"
#include "services/common/weights_fingerprint.h"
#include "services/common/worker_metrics.h"

namespace specd {
namespace {

namespace pb = ::specd::worker::v1;

std::vector<FlagSpec> WorkerFlags() {
  return {
      {"listen", "gRPC address host:port (port 0 picks a free one) or unix:PATH", "127.0.0.1:0"},
      {"model", "model directory (Hugging Face format)", "", false, true},
      {"exit-layer", "run only the first L layers (early-exit self-speculation draft); 0 = all",
       "0"},
      {"draft-vocab",
       "draft worker only: compute logits for the N most frequent tokens only (FR-Spec's "
       "reduced head), ranked by --draft-vocab-file or else by the tokenizer; 0 = all tokens",
       "0"},
      {"draft-vocab-file",
       "token-frequency file for --draft-vocab (\"TOKEN_ID<TAB>COUNT\" lines; `specd "
       "token-freq` measures one from the target's generations)",
       ""},
      {"kv-tokens", "KV cache capacity in tokens, across all sequences", "16384"},
      {"kv-block-size", "tokens per KV cache block", "16"},
      {"max-seq-len", "longest sequence served; 0 = the model's max_position_embeddings", "0"},
      {"max-pass-tokens",
       "tokens of the largest forward pass: the scratch memory is reserved for it, and the "
       "coordinator spreads prefill chunks over rounds to keep every pass within it (vLLM's "
       "max_num_batched_tokens)",
       "2048"},
      {"prefix-caching",
       "on: keep the KV of full blocks of shared prefixes and reuse it for later sequences; off",
       "on"},
      {"backend",
       "compute back end: cpu, cuda, or auto (CUDA when this build has it and a GPU is present)",
       "auto"},
      {"kv-dtype", "KV cache element type: f32, bf16 or f16 (16-bit halves the KV memory)", "f32"},
      {"gpu-memory-fraction",
       "share of the GPU's memory for this worker (like vLLM's gpu_memory_utilization); the KV "
       "cache takes what the weights and scratch leave of it, and --kv-tokens is ignored. 0 = "
       "size the KV cache by --kv-tokens. Ignored on the CPU back end",
       "0"},
      {"gpu-memory-peer",
       "model directory of the other worker sharing the GPU: --gpu-memory-fraction is then both "
       "workers' share together, split so that both KV pools hold the same number of tokens",
       ""},
      {"gpu-memory-peer-exit-layer", "the peer's --exit-layer (0 = all its layers)", "0"},
      {"cuda-graphs",
       "record decode and verify forward passes as CUDA graphs, one per batch shape (on or off)",
       "on"},
      {"threads", "CPU threads for the forward pass; 0 = one per core", "0"},
      {"metrics-port", "port of the Prometheus /metrics endpoint; 0 = a free one, -1 = off", "0"},
      {"local-socket",
       "also serve a round's calls on this Unix socket, for a coordinator on the same host "
       "(bypasses gRPC's per-call cost; Info names it); empty = off",
       ""},
      {"drain-seconds",
       "on SIGTERM, how long to serve on while sequences are held or calls are in flight; a "
       "second SIGTERM stops at once",
       "10"},
  };
}

struct WorkerConfig {
  ListenAddress listen;
  std::filesystem::path model;
  int64_t exit_layer = 0;
  int64_t draft_vocab = 0;
  std::filesystem::path draft_vocab_file;
  kernels::BackendOptions backend;
  int64_t metrics_port = 0;
  int64_t drain_seconds = 10;
  std::string local_socket;  // absolute; empty = none
  EngineOptions engine;
  WorkerRuntimeOptions runtime;
};

absl::StatusOr<WorkerConfig> ReadConfig(const Flags& flags) {
  WorkerConfig c;
  SPECD_ASSIGN_OR_RETURN(c.listen, ParseListenAddress("listen", flags.Get("listen")));
  c.model = flags.Get("model");
  SPECD_ASSIGN_OR_RETURN(c.exit_layer, flags.GetInt("exit-layer", 0, 1 << 20));
  SPECD_ASSIGN_OR_RETURN(c.draft_vocab, flags.GetInt("draft-vocab", 0, int64_t{1} << 31));
  c.draft_vocab_file = flags.Get("draft-vocab-file");
  if (!c.draft_vocab_file.empty() && c.draft_vocab == 0) {
    return absl::InvalidArgumentError("--draft-vocab-file needs --draft-vocab N");
  }
  SPECD_ASSIGN_OR_RETURN(c.engine.kv_capacity_tokens,
                         flags.GetInt("kv-tokens", 1, int64_t{1} << 40));
  SPECD_ASSIGN_OR_RETURN(c.engine.kv_block_size, flags.GetInt("kv-block-size", 1, 1 << 16));
  SPECD_ASSIGN_OR_RETURN(c.engine.max_seq_len, flags.GetInt("max-seq-len", 0, int64_t{1} << 31));
  SPECD_ASSIGN_OR_RETURN(c.engine.max_pass_tokens,
                         flags.GetInt("max-pass-tokens", kMinMaxPassTokens, int64_t{1} << 24));
  SPECD_ASSIGN_OR_RETURN(c.engine.prefix_caching, flags.GetOnOff("prefix-caching"));
  SPECD_ASSIGN_OR_RETURN(c.backend.kind, kernels::ParseBackendKind(flags.Get("backend")));
  SPECD_ASSIGN_OR_RETURN(c.engine.kv_dtype, kernels::ParseKvDType(flags.Get("kv-dtype")));
  SPECD_ASSIGN_OR_RETURN(c.engine.gpu_memory_fraction, flags.GetDouble("gpu-memory-fraction"));
  if (!(c.engine.gpu_memory_fraction >= 0.0 && c.engine.gpu_memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-fraction must be in [0, 1], got ",
                                                   c.engine.gpu_memory_fraction));
  }
  if (const std::string peer = flags.Get("gpu-memory-peer"); !peer.empty()) {
    absl::StatusOr<ModelConfig> peer_config = LoadModelConfig(peer);
    if (!peer_config.ok()) {
      // `specd serve` derives the peer from the models it was given, so a bad --model is the
      // error to report first.
      if (absl::StatusOr<ModelConfig> own = LoadModelConfig(c.model); !own.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--model: ", own.status().message()));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu-memory-peer: ", peer_config.status().message()));
    }
    SPECD_ASSIGN_OR_RETURN(const int64_t peer_exit,
                           flags.GetInt("gpu-memory-peer-exit-layer", 0, 1 << 20));
    if (peer_exit > 0) peer_config->num_layers = std::min(peer_config->num_layers, peer_exit);
    // `specd serve` gives both workers the same --kv-dtype and --max-pass-tokens.
    const ModelMemory m =
        EstimateModelMemory(*peer_config, c.engine.kv_dtype, c.engine.max_pass_tokens);
    c.engine.peer_fixed_bytes = m.weights_bytes + m.scratch_reserve_bytes;
    c.engine.peer_kv_bytes_per_token = m.kv_bytes_per_token;
  }
  SPECD_ASSIGN_OR_RETURN(c.engine.record_forwards, flags.GetOnOff("cuda-graphs"));
  SPECD_ASSIGN_OR_RETURN(const int64_t threads, flags.GetInt("threads", 0, 4096));
  c.backend.num_threads = static_cast<int>(threads);
  SPECD_ASSIGN_OR_RETURN(c.metrics_port, flags.GetInt("metrics-port", -1, 65535));
  SPECD_ASSIGN_OR_RETURN(c.drain_seconds, flags.GetInt("drain-seconds", 0, 3600));
  if (const std::string path = flags.Get("local-socket"); !path.empty()) {
    c.local_socket = std::filesystem::absolute(path).string();
  }
  return c;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The parts of Info that never change; the tokenizer files travel so the coordinator needs no
// model volume of its own.
absl::StatusOr<pb::InfoResponse> StaticInfo(const WorkerMainSpec& spec, const WorkerConfig& config,
                                            LlamaEngine& engine) {
  pb::InfoResponse info;
  info.set_role(spec.role);
  info.set_protocol_version(kWorkerProtocolVersion);
  const std::filesystem::path dir = std::filesystem::weakly_canonical(config.model);
  info.set_model_name(dir.filename().string());
  info.set_model_config_json(ModelConfigToJson(engine.config()));
  // Mapped again (the engine keeps its own copy of the weights); the samples read the pages the
  // load has just brought in.
  SPECD_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir));
  info.set_weights_fingerprint(WeightsFingerprint(*checkpoint));
  info.set_num_layers(static_cast<int32_t>(engine.config().num_layers));
  info.mutable_eos_token_ids()->Add(engine.config().eos_token_ids.begin(),
                                    engine.config().eos_token_ids.end());
  info.set_vocab_size(engine.config().vocab_size);
  info.set_kv_block_size(engine.kv().block_size());
  info.set_kv_total_blocks(engine.kv().total_blocks());
  info.set_max_seq_len(engine.max_seq_len());
  info.set_max_pass_tokens(engine.max_pass_tokens());
  std::random_device random;
  info.set_epoch((uint64_t{random()} << 32) | random());
  info.set_local_socket(config.local_socket);
  info.set_num_threads(engine.backend().num_threads());
  info.set_backend(std::string(engine.backend().name()));
  info.set_prefix_caching(engine.kv().prefix_caching());
  info.set_max_speculative_tokens(kMaxSpeculativeTokens);
  info.set_max_candidates(kMaxCandidates);
  info.set_kv_dtype(std::string(kernels::KvDTypeFlagName(engine.kv_dtype())));
  info.set_kv_bytes_per_token(engine.kv_bytes_per_token());
  info.set_output_vocab_size(engine.logits_width());
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    if (!std::filesystem::exists(dir / file)) continue;
    SPECD_ASSIGN_OR_RETURN(std::string text, ReadFile(dir / file));
    (*info.mutable_tokenizer_files())[file] = std::move(text);
  }
  if (info.tokenizer_files().contains("tokenizer.json")) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::LoadFromDir(dir);
    if (!tokenizer.ok()) {
      return absl::Status(
          tokenizer.status().code(),
          absl::StrCat("tokenizer of ", dir.string(), ": ", tokenizer.status().message()));
    }
    if ((*tokenizer)->vocab_size() > engine.config().vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir.string(), ": tokenizer.json has ", (*tokenizer)->vocab_size(),
                       " tokens but config.json's vocab_size is ", engine.config().vocab_size));
    }
    info.set_tokenizer_fingerprint((*tokenizer)->Fingerprint());
  } else {
    LogLine(spec.program) << "warning: " << dir.string()
                          << " has no tokenizer.json; Info will carry no tokenizer";
  }
  return info;
}

absl::StatusOr<std::unique_ptr<LlamaEngine>> LoadEngine(const WorkerMainSpec& spec,
                                                        const WorkerConfig& config) {
  LogLine(spec.program) << "loading " << config.model.string()
                        << (config.exit_layer > 0
                                ? absl::StrCat(" (first ", config.exit_layer, " layers)")
                                : std::string())
                        << " on the " << kernels::BackendKindName(config.backend.kind)
                        << " back end, " << kernels::KvDTypeFlagName(config.engine.kv_dtype)
                        << " KV";
  const auto start = std::chrono::steady_clock::now();
  LoadOptions load;
  load.exit_layer = config.exit_layer;
  if (config.draft_vocab > 0) {
    if (spec.role != pb::WORKER_ROLE_DRAFT) {
      return absl::InvalidArgumentError(
          "--draft-vocab is for the draft worker: verifying needs every token's logit");
    }
    const absl::StatusOr<ModelConfig> model_config = LoadModelConfig(config.model);
    if (!model_config.ok()) return model_config.status();
    SPECD_ASSIGN_OR_RETURN(load.output_vocab,
                           SelectOutputVocab(config.model, model_config->vocab_size,
                                             config.draft_vocab, config.draft_vocab_file));
    LogLine(spec.program) << "the classifier keeps " << config.draft_vocab << " of "
                          << model_config->vocab_size << " tokens, ranked by "
                          << (config.draft_vocab_file.empty() ? std::string("the tokenizer")
                                                              : config.draft_vocab_file.string());
  }
  // A load that takes seconds (a large checkpoint, a slow disk) shows progress at most once a
  // second; a fast one says only that it loaded.
  int last_decile = -1;
  auto last_line = start;
  load.progress = [&](int64_t done, int64_t total) {
    const int decile = total > 0 ? static_cast<int>(10 * done / total) : 10;
    if (decile == last_decile) return;
    last_decile = decile;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_line < std::chrono::seconds(1)) return;
    last_line = now;
    LogLine(spec.program) << "loading weights " << 10 * decile << "% (" << done << "/" << total
                          << " tensors)";
  };
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<LlamaEngine> engine,
                         CreateEngine(config.model, config.backend, config.engine, load));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const ModelConfig& c = engine->config();
  LogLine(spec.program) << "loaded " << c.num_layers << " layers, hidden " << c.hidden_size
                        << ", vocab " << c.vocab_size << " in " << seconds << " s; KV "
                        << engine->kv().total_blocks() << " blocks of " << engine->kv().block_size()
                        << " tokens in " << kernels::KvDTypeFlagName(engine->kv_dtype()) << " ("
                        << engine->kv_bytes_per_token() << " bytes/token), prefix caching "
                        << (engine->kv().prefix_caching() ? "on" : "off") << "; max_seq_len "
                        << engine->max_seq_len() << ", max pass " << engine->max_pass_tokens()
                        << " tokens; " << engine->backend().name() << " back end"
                        << (NeedsSelfCheck(engine->backend()) ? " (passed its self-check)" : "")
                        << ", " << engine->backend().num_threads() << " threads";
  return engine;
}

// The first part of a drain: while the worker holds sequences a draining coordinator may still
// need it for their last rounds (it is often stopped at the same moment, by an orchestrator or
// `specd serve`), so it serves on until they are all released, `deadline` passes or a second
// SIGTERM/SIGINT comes. Returns why it stopped waiting.
enum class DrainWait { kReleased, kDeadline, kSecondSignal };

DrainWait WaitForSequencesReleased(EngineThread& engine, const sigset_t& stop_signals,
                                   std::chrono::steady_clock::time_point deadline) {
  std::future<int64_t> held;
  while (true) {
    if (!held.valid()) {
      auto count = std::make_shared<std::promise<int64_t>>();
      held = count->get_future();
      // Read on the engine thread, which owns the runtime; it answers between jobs.
      engine.Post([count](WorkerRuntime& runtime) { count->set_value(runtime.num_sequences()); });
    }
    if (held.wait_for(std::chrono::seconds(0)) == std::future_status::ready && held.get() == 0) {
      return DrainWait::kReleased;
    }
    if (std::chrono::steady_clock::now() >= deadline) return DrainWait::kDeadline;
    const timespec poll = {0, 50'000'000};
    if (sigtimedwait(&stop_signals, nullptr, &poll) > 0) return DrainWait::kSecondSignal;
  }
}

int Fail(const WorkerMainSpec& spec, const absl::Status& status) {
  LogLine(spec.program) << status.message();
  return 1;
}

}  // namespace

int WorkerMain(int argc, char** argv, const WorkerMainSpec& spec) {
  const sigset_t stop_signals = StartServiceProcess();

  const std::vector<FlagSpec> specs = WorkerFlags();
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: " << spec.program << " --model DIR [flags]\n"
                << spec.summary << "\n\n"
                << Flags::Usage(specs);
      return 0;
    }
  }
  absl::StatusOr<Flags> flags = Flags::Parse(args, specs);
  absl::StatusOr<WorkerConfig> config =
      flags.ok() ? ReadConfig(*flags) : absl::StatusOr<WorkerConfig>(flags.status());
  if (!config.ok()) {
    std::cerr << spec.program << ": " << config.status().message() << "\n\n" << Flags::Usage(specs);
    return 2;
  }
  WorkerMetrics metrics;
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = LoadEngine(spec, *config);
  if (!engine.ok()) return Fail(spec, engine.status());
  absl::StatusOr<pb::InfoResponse> info = StaticInfo(spec, *config, **engine);
  if (!info.ok()) return Fail(spec, info.status());
  metrics.OnLoaded(**engine);

  WorkerRuntimeOptions runtime_options = config->runtime;
  runtime_options.observer = &metrics;
  // A lost device (a CUDA sticky error) fails every later call of this process, while gRPC would
  // go on answering Info and health as if the worker served: exit instead, so that `specd serve`
  // or the container's restart policy starts a worker on a fresh context, and the coordinator
  // replays its sequences there. Nothing can be drained on such a device.
  EngineThread engine_thread(std::make_unique<WorkerRuntime>(*std::move(engine), runtime_options),
                             [&spec](const absl::Status& lost) {
                               LogLine(spec.program)
                                   << lost.message() << "; exiting (status " << kExitDeviceLost
                                   << ") so that the worker restarts on a fresh device context";
                               std::_Exit(kExitDeviceLost);
                             });
  // On the engine thread, which then serves: its first real call finds everything warm.
  std::promise<absl::Status> warmed;
  engine_thread.Post([&warmed, draft = spec.role == pb::WORKER_ROLE_DRAFT](WorkerRuntime& r) {
    warmed.set_value(r.WarmUp(draft));
  });
  if (const absl::Status st = warmed.get_future().get(); !st.ok()) return Fail(spec, st);
  WorkerRpcs rpcs(&engine_thread, *std::move(info), spec.program);
  const std::unique_ptr<grpc::Service> service = spec.make_service(&rpcs);

  const std::string& host = config->listen.metrics_host;
  if (config->metrics_port >= 0) {
    absl::StatusOr<int> port = metrics.Serve(host, static_cast<int>(config->metrics_port));
    if (!port.ok()) return Fail(spec, port.status());
    std::cout << "metrics on " << host << ":" << *port << std::endl;
  }

  // Before gRPC: a coordinator that reads Info finds the socket Info names already listening.
  std::unique_ptr<LocalSocketServer> local_server;
  if (!config->local_socket.empty()) {
    absl::StatusOr<std::unique_ptr<LocalSocketServer>> started =
        LocalSocketServer::Start(config->local_socket, &rpcs, spec.program);
    if (!started.ok()) return Fail(spec, started.status());
    local_server = *std::move(started);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  config->listen.AddTo(builder, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service.get());
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(spec, absl::UnavailableError(config->listen.CannotListen()));
  }
  server->GetHealthCheckService()->SetServingStatus(spec.service_name, true);
  const std::string bound = config->listen.Bound(port);
  std::cout << "listening on " << bound << std::endl;
  LogLine(spec.program) << "serving " << spec.service_name << " on " << bound;

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LogLine(spec.program) << (signal_number == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining (up to "
                        << config->drain_seconds << " s)";
  server->GetHealthCheckService()->SetServingStatus(false);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(config->drain_seconds);
  const DrainWait wait = WaitForSequencesReleased(engine_thread, stop_signals, deadline);
  LogLine(spec.program) << (wait == DrainWait::kReleased   ? "no sequences held"
                            : wait == DrainWait::kDeadline ? "drain period over"
                                                           : "second signal")
                        << "; stopping";
  // New calls are refused from here; in-flight ones finish (their jobs still run on the engine
  // thread) or are cancelled at the deadline, at once after a second signal. Shutdown returns
  // once every reactor is done.
  if (local_server != nullptr) local_server->Stop();  // its calls in flight reply first
  const auto left = wait == DrainWait::kSecondSignal
                        ? std::chrono::steady_clock::duration::zero()
                        : std::max(deadline - std::chrono::steady_clock::now(),
                                   std::chrono::steady_clock::duration::zero());
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  server->Wait();
  engine_thread.Stop();
  LogLine(spec.program) << "stopped";
  return 0;
}

}  // namespace specd
