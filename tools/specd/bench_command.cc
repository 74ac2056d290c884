// `specd bench`: a gRPC load generator for a running `specd serve`, and with --compare the
// side-by-side measurement of speculative decoding against plain decoding (K = 0) on the same
// server, set against the speed-ups the workers' own step times predict.
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "specd/v1/generation.grpc.pb.h"
#include "tools/specd/bench/bench_report.h"
#include "tools/specd/bench/bench_stats.h"
#include "tools/specd/bench/http_load.h"
#include "tools/specd/bench/load_generator.h"
#include "tools/specd/bench/scenarios.h"
#include "tools/specd/command.h"
#include "tools/specd/progress.h"

namespace specd::cli {
namespace {

// The first lines, for `specd --help`'s list of commands.
constexpr char kSummary[] =
    "Load-test a running `specd serve` over gRPC, or with --compare measure speculative decoding\n"
    "against plain decoding (K = 0) on the same server.";

constexpr char kHelp[] =
    "Load-test a running `specd serve` over gRPC, or with --compare measure speculative decoding\n"
    "against plain decoding (K = 0) on the same server.\n"
    "  specd bench --server 127.0.0.1:50051 --streams 8 --max-tokens 128 --json out.json\n"
    "  specd bench --server 127.0.0.1:50051 --compare --k 1,2,4,8 --repeats 3\n"
    "  specd bench --server 127.0.0.1:50051 --http 127.0.0.1:8000 --streams 16 --k 0,4\n"
    "\n"
    "With --http (the same server's OpenAI-compatible API, `specd serve --http-listen`), every\n"
    "arm also runs over HTTP as streamed /v1/completions requests (one connection each), the\n"
    "gRPC and HTTP runs of an arm alternating within each repeat, and the report adds what HTTP\n"
    "costs: the difference of mean TPOT (added ms per output token) and the ratio of median\n"
    "output tok/s at --streams streams.\n"
    "\n"
    "Each arm (one K, one policy) sends --requests requests over --streams concurrent streams,\n"
    "in a closed loop or at --rate requests/s; request i uses prompt i mod P and seed --seed + i\n"
    "in every arm. Arms alternate within each of --repeats rounds ([K=0, K=k1, ...] with\n"
    "--compare) so that drift hits every arm alike. Requests ask for K_POLICY_FIXED unless\n"
    "--adaptive (then K > 0 arms ask for K_POLICY_ADAPTIVE: the server may lower K under load).\n"
    "\n"
    "Definitions (sums over an arm's requests' final Usage messages):\n"
    "  out tok/s    output tokens received / the repeat's wall time (client clock); the\n"
    "               median over the repeats is reported\n"
    "  TTFT         request sent -> first message with tokens\n"
    "  ITL          gap between consecutive token-bearing messages of a request, one sample\n"
    "               per message (as vLLM's benchmark_serving)\n"
    "  TPOT         (end-to-end latency - TTFT) / (output tokens - 1), per request\n"
    "  percentiles  p50/p90/p99 by linear interpolation between the nearest ranks (numpy's\n"
    "               default method)\n"
    "  accept       accepted_tokens / draft_tokens (vLLM's draft acceptance rate)\n"
    "  alpha        accepted_tokens / draft positions judged, where a round judges its drafts\n"
    "               up to and including the first rejected one: the per-token acceptance\n"
    "               probability alpha of Leviathan et al. 2023 (the predictions use it)\n"
    "  tok/round    mean accepted length, (accepted_tokens + rounds) / rounds\n"
    "  per-position accepted_per_position[k] / drafting_rounds\n"
    "  T_fwd        verify_forward_ns / rounds of Usage.timings: T_t, one plain target step,\n"
    "               in the K=0 arm; T_v(K), one (K+1)-token verification, in a K arm\n"
    "  T_d          draft_forward_ns / draft_steps, one draft step\n"
    "  overhead     sum(round_ns - draft_forward_ns - verify_forward_ns) per round and as a\n"
    "               fraction of sum(round_ns): RPC, accept/reject, scheduling\n"
    "  (with several streams the step times are those of whole batches)\n"
    "  E[tokens]    (1 - alpha^(K+1)) / (1 - alpha)\n"
    "  ideal        Leviathan et al.: E[tokens] / (K T_d/T_t + 1)\n"
    "  engine       the engine-limited speed-up: E[tokens] T_t / (K T_d + T_v(K))\n"
    "  measured     median out tok/s of the K arm / that of the K=0 arm\n"
    "  efficiency   measured / engine: what the service adds beyond the forward passes\n"
    "Under --adaptive the predictions use the K the rounds really drafted on average.\n"
    "\n"
    "--guidance-scale S adds classifier-free guidance arms beside every unguided one: 'cfg'\n"
    "(the target guided, the draft drafting unguided) and, for K > 0, 'cfg+draft' (the draft\n"
    "guided too), with --unconditional as the unconditional prompt (empty: BOS). The report then\n"
    "sets each guided arm against the unguided arm of the same K (tok/s ratio, alpha), and a\n"
    "guided K arm's speed-up against K=0 cfg.\n"
    "\n"
    "--scenario runs one workload on --server (a: prefix caching, prefix sharing or chunked\n"
    "prefill on) and --baseline (b: off), alternating a and b in each of --repeats rounds, and\n"
    "reports a / b:\n"
    "  shared-prefix  a warm-up request caches --prefix-tokens; then --prefix-requests requests\n"
    "                 with that prefix and their own --suffix-tokens, one at a time: TTFT\n"
    "  burst          --prefix-requests requests with a new prefix of --prefix-tokens and their\n"
    "                 own --suffix-tokens, all at once: TTFT and out tok/s\n"
    "  chat           --conversations at once, --turns each, every turn resending the history\n"
    "                 (a shared system prompt, user turns, the replies): out tok/s and TTFT\n"
    "  long-prompts   --decode-streams decoding while prompts of --long-prompt-tokens arrive one\n"
    "                 after another: the decoding streams' ITL, and the long prompts' TTFT\n"
    "  e.g. specd bench --scenario chat --server 127.0.0.1:50051 --baseline 127.0.0.1:50052";

// Prompts for runs without --prompts: short story openings, as the TinyStories models expect.
constexpr const char* kBuiltinPrompts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Tom and his dog went to the park to play with a big red ball.",
    "One day, a small bird found a shiny key in the garden.",
    "The sun was warm and the sky was blue. Max wanted to build a sandcastle.",
    "Mom said, \"Let's bake a cake for Grandpa's birthday!\"",
    "In a quiet forest lived an old owl who knew every story.",
    "Sara had a new red bike, and she wanted to ride it to school.",
    "The little boat sailed across the lake as the wind began to blow.",
};

// A prompt as text (tokenized by the server) or as token ids (used as given).
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

absl::StatusOr<std::vector<int32_t>> IdsFromJson(const nlohmann::json& j,
                                                 const std::string& where) {
  if (!j.is_array()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an array"));
  std::vector<int32_t> ids;
  for (const nlohmann::json& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", v.dump(), " is not a token id"));
    }
    ids.push_back(v.get<int32_t>());
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no token ids"));
  return ids;
}

// One prompt per line: plain text, or a JSON object with "prompt" (text) or "prompt_ids" /
// "token_ids" (ids). Empty lines are skipped.
absl::StatusOr<std::vector<Prompt>> LoadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts: cannot read ", path));
  std::vector<Prompt> prompts;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", n);
    Prompt p;
    if (line.front() != '{') {
      p.text = line;
      prompts.push_back(std::move(p));
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    if (j.contains("prompt") && j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
    } else if (j.contains("prompt_ids") || j.contains("token_ids")) {
      const char* key = j.contains("prompt_ids") ? "prompt_ids" : "token_ids";
      SPECD_ASSIGN_OR_RETURN(p.ids, IdsFromJson(j[key], absl::StrCat(where, ": \"", key, "\"")));
      p.is_ids = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": needs \"prompt\" (a string) or \"prompt_ids\" (an array of token ids)"));
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty())
    return absl::InvalidArgumentError(absl::StrCat("--prompts: ", path, " is empty"));
  return prompts;
}

// The built-in prompts as text, or, for a server without a tokenizer, fixed pseudo-random token
// ids below its vocabulary size.
std::vector<Prompt> BuiltinPrompts(v1::Generation::Stub& stub, int64_t vocab_size) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::TokenizeRequest req;
  req.set_text(kBuiltinPrompts[0]);
  v1::TokenizeResponse resp;
  const bool has_tokenizer = stub.Tokenize(&ctx, req, &resp).ok();
  std::vector<Prompt> prompts;
  uint64_t state = 12345;
  for (const char* text : kBuiltinPrompts) {
    Prompt p;
    if (has_tokenizer) {
      p.text = text;
    } else {
      p.is_ids = true;
      for (int i = 0; i < 16; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const int64_t range = std::max<int64_t>(vocab_size - 3, 1);
        p.ids.push_back(static_cast<int32_t>(3 + static_cast<int64_t>(state >> 33) % range));
      }
    }
    prompts.push_back(std::move(p));
  }
  return prompts;
}

absl::StatusOr<std::vector<int32_t>> ParseKList(const std::string& text) {
  std::vector<int32_t> ks;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t k = -1;
    if (!absl::SimpleAtoi(part, &k) || k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--k takes K values >= 0 separated by commas, got '", text, "'"));
    }
    if (std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
  }
  if (ks.empty()) return absl::InvalidArgumentError("--k is empty");
  return ks;
}

// --arms: arms separated by ';', each a comma-separated list of k=N, adaptive, ngram, tree=BxD,
// egag, no-egag; e.g. "k=4;k=4,tree=2x2;k=14".
absl::StatusOr<std::vector<bench::ArmSpec>> ParseArmList(const std::string& text) {
  std::vector<bench::ArmSpec> arms;
  for (absl::string_view spec : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    bench::ArmSpec arm;
    bool has_k = false;
    for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
      part = absl::StripAsciiWhitespace(part);
      int32_t b = 0, d = 0;
      if (absl::ConsumePrefix(&part, "k=")) {
        has_k = absl::SimpleAtoi(part, &arm.k) && arm.k >= 0;
        if (!has_k) break;
      } else if (part == "adaptive") {
        arm.adaptive = true;
      } else if (part == "ngram") {
        arm.ngram = true;
      } else if (part == "egag" || part == "no-egag") {
        arm.egag = part == "egag";
      } else if (absl::ConsumePrefix(&part, "tree=")) {
        const std::vector<absl::string_view> bd = absl::StrSplit(part, 'x');
        if (bd.size() != 2 || !absl::SimpleAtoi(bd[0], &b) || !absl::SimpleAtoi(bd[1], &d)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--arms: '", spec, "': tree takes BRANCHINGxDEPTH, e.g. tree=2x2"));
        }
        arm.tree_branching = b;
        arm.tree_depth = d;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--arms: '", spec, "': unknown part '", part,
                         "' (want k=N, adaptive, ngram, tree=BxD, egag or no-egag)"));
      }
    }
    if (!has_k) {
      return absl::InvalidArgumentError(absl::StrCat("--arms: '", spec, "' needs k=N, N >= 0"));
    }
    arms.push_back(arm);
  }
  if (arms.empty()) return absl::InvalidArgumentError("--arms is empty");
  return arms;
}

struct BenchConfig {
  std::string server;
  int http_port = 0;  // --http: also run every arm over the HTTP API; 0 = not
  int64_t streams = 1, requests = 0, repeats = 1, warmup = 0, max_tokens = 0;
  double rate = 0, temperature = 0, top_p = 1, timeout = 0;
  int64_t top_k = 0;
  bench::Arrival arrival = bench::Arrival::kPoisson;
  std::string arrival_name;
  uint64_t seed = 0;
  bool ignore_eos = true, compare = false, adaptive = false, quiet = false;
  std::vector<int32_t> ks;                // --k; empty: the server's default
  std::vector<bench::ArmSpec> arm_specs;  // --arms
  std::vector<bench::ArmSpec> arms;
  std::string prompts_source;
  std::string json_path;
  double guidance_scale = 0;  // 0: no guided arms
  std::string unconditional;
};

// The bounds keep absurd values (a billion streams, each a thread) from exhausting the machine.
absl::StatusOr<int64_t> IntInRange(const Flags& args, const char* name, int64_t min, int64_t max) {
  SPECD_ASSIGN_OR_RETURN(const int64_t v, args.GetInt(name));
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", min, ", ", max, "], got ", v));
  }
  return v;
}

absl::StatusOr<BenchConfig> ParseConfig(const Flags& args) {
  BenchConfig c;
  c.server = args.Get("server");
  SPECD_ASSIGN_OR_RETURN(c.streams, IntInRange(args, "streams", 1, 4096));
  c.requests = c.streams * 4;
  if (args.Has("requests")) {
    SPECD_ASSIGN_OR_RETURN(c.requests, IntInRange(args, "requests", 1, 1000000));
  }
  c.compare = args.GetBool("compare");
  c.adaptive = args.GetBool("adaptive");
  c.repeats = c.compare ? 3 : 1;
  if (args.Has("repeats")) {
    SPECD_ASSIGN_OR_RETURN(c.repeats, IntInRange(args, "repeats", 1, 1000));
  }
  c.warmup = c.streams;
  if (args.Has("warmup")) {
    SPECD_ASSIGN_OR_RETURN(c.warmup, IntInRange(args, "warmup", 0, 100000));
  }
  SPECD_ASSIGN_OR_RETURN(c.max_tokens, IntInRange(args, "max-tokens", 1, 1 << 24));
  SPECD_ASSIGN_OR_RETURN(c.top_k, IntInRange(args, "top-k", 0, INT32_MAX));
  SPECD_ASSIGN_OR_RETURN(c.rate, args.GetDouble("rate"));
  SPECD_ASSIGN_OR_RETURN(c.temperature, args.GetDouble("temperature"));
  SPECD_ASSIGN_OR_RETURN(c.top_p, args.GetDouble("top-p"));
  SPECD_ASSIGN_OR_RETURN(c.timeout, args.GetDouble("timeout"));
  if (!(c.rate >= 0 && c.rate <= 1e6)) {
    return absl::InvalidArgumentError("--rate must be in [0, 1e6] requests/s (0 = closed loop)");
  }
  if (!(c.temperature >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
  if (!(c.top_p > 0 && c.top_p <= 1))
    return absl::InvalidArgumentError("--top-p must be in (0, 1]");
  if (!(c.timeout > 0 && c.timeout <= 1e6)) {
    return absl::InvalidArgumentError("--timeout must be in (0, 1e6] seconds");
  }
  c.arrival_name = args.Get("arrival");
  SPECD_ASSIGN_OR_RETURN(c.arrival, bench::ParseArrival(c.arrival_name));
  SPECD_ASSIGN_OR_RETURN(const int64_t seed, args.GetInt("seed"));
  c.seed = static_cast<uint64_t>(seed);
  c.ignore_eos = args.GetBool("ignore-eos");
  c.quiet = args.GetBool("quiet");
  c.json_path = args.Get("json");
  if (args.Has("k") && args.Has("arms")) {
    return absl::InvalidArgumentError("give --k or --arms, not both");
  }
  if (args.Has("http")) {
    // The load generator's HTTP client speaks plain HTTP to loopback, where `specd serve` runs.
    const std::string http = args.Get("http");
    const size_t colon = http.rfind(':');
    const std::string host = colon == std::string::npos ? "" : http.substr(0, colon);
    if ((host != "127.0.0.1" && host != "localhost") ||
        !absl::SimpleAtoi(http.substr(colon + 1), &c.http_port) || c.http_port < 1 ||
        c.http_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http takes the loopback address of the server's HTTP API, 127.0.0.1:PORT; got '", http,
          "'"));
    }
  }
  SPECD_ASSIGN_OR_RETURN(c.guidance_scale, args.GetDouble("guidance-scale"));
  if (!(c.guidance_scale >= 0 && c.guidance_scale <= 10)) {
    return absl::InvalidArgumentError("--guidance-scale must be in [0, 10] (0 = no guided arms)");
  }
  c.unconditional = args.Get("unconditional");
  if (c.http_port > 0 && c.guidance_scale > 0) {
    return absl::InvalidArgumentError(
        "--guidance-scale and --http are separate comparisons: run them one at a time");
  }
  if (args.Has("k")) {
    SPECD_ASSIGN_OR_RETURN(c.ks, ParseKList(args.Get("k")));
    if (c.compare && *std::max_element(c.ks.begin(), c.ks.end()) == 0) {
      return absl::InvalidArgumentError("--compare needs at least one K > 0 in --k");
    }
  }
  if (args.Has("arms")) {
    SPECD_ASSIGN_OR_RETURN(c.arm_specs, ParseArmList(args.Get("arms")));
  }
  return c;
}

// The --k arms (the server's default K without --k).
absl::Status ResolveKArms(const v1::GetServerInfoResponse& info, BenchConfig& c) {
  std::vector<int32_t> ks = c.ks;
  if (ks.empty()) ks.push_back(static_cast<int32_t>(info.default_num_speculative_tokens()));
  for (const int32_t k : ks) {
    if (info.max_num_speculative_tokens() > 0 &&
        static_cast<uint32_t>(k) > info.max_num_speculative_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat("--k ", k, " exceeds the server's limit of ",
                                                     info.max_num_speculative_tokens()));
    }
  }
  if (c.compare) {
    c.arms.push_back({0, false});
    for (const int32_t k : ks) {
      if (k > 0) c.arms.push_back({k, c.adaptive});
    }
    if (c.arms.size() < 2) {
      return absl::InvalidArgumentError("--compare needs at least one K > 0 in --k");
    }
  } else {
    for (const int32_t k : ks) c.arms.push_back({k, c.adaptive && k > 0});
  }
  return absl::OkStatus();
}

// The arms: --arms, or the --k values (the server's default K without --k), with K = 0 first
// under --compare, and each arm's HTTP twin with --http.
absl::Status ResolveArms(const v1::GetServerInfoResponse& info, BenchConfig& c) {
  if (!c.arm_specs.empty()) {
    if (c.compare) c.arms.push_back({0, false});
    for (const bench::ArmSpec& arm : c.arm_specs) {
      if (!c.compare || arm.k > 0) c.arms.push_back(arm);
    }
    if (c.compare && c.arms.size() < 2) {
      return absl::InvalidArgumentError("--compare needs at least one arm with K > 0 in --arms");
    }
  } else {
    SPECD_RETURN_IF_ERROR(ResolveKArms(info, c));
  }
  if (c.http_port > 0) {
    // Each arm's HTTP twin right after it, so the two alternate within every repeat.
    std::vector<bench::ArmSpec> both;
    for (const bench::ArmSpec& a : c.arms) {
      both.push_back(a);
      bench::ArmSpec twin = a;
      twin.http = true;
      both.push_back(twin);
    }
    c.arms = std::move(both);
  }
  if (c.guidance_scale > 0) {
    // Each unguided arm, then its guided twins, so every repeat runs them side by side. The
    // server refuses guidance with a tree, and a guided draft where prompt lookup drafts.
    const bool ngram_default = info.default_draft_method() == v1::DRAFT_METHOD_NGRAM;
    std::vector<bench::ArmSpec> arms;
    for (const bench::ArmSpec& a : c.arms) {
      arms.push_back(a);
      if (a.k > 0 && a.tree_branching > 0) continue;
      bench::ArmSpec twin = a;
      twin.guidance = bench::ArmGuidance::kTarget;
      arms.push_back(twin);
      if (a.k > 0 && !a.ngram && !ngram_default) {
        twin.guidance = bench::ArmGuidance::kTargetAndDraft;
        arms.push_back(twin);
      }
    }
    c.arms = std::move(arms);
  }
  return absl::OkStatus();
}

std::vector<v1::GenerateRequest> BuildRequests(const BenchConfig& c, const bench::ArmSpec& arm,
                                               const std::vector<Prompt>& prompts, int64_t n) {
  std::vector<v1::GenerateRequest> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v1::GenerateRequest r;
    const Prompt& p = prompts[static_cast<size_t>(i) % prompts.size()];
    if (p.is_ids) {
      r.mutable_token_ids()->mutable_ids()->Add(p.ids.begin(), p.ids.end());
    } else {
      r.set_text(p.text);
    }
    v1::SamplingParameters* s = r.mutable_sampling();
    s->set_temperature(static_cast<float>(c.temperature));
    s->set_top_k(static_cast<int32_t>(c.top_k));
    s->set_top_p(static_cast<float>(c.top_p));
    s->set_seed(c.seed + static_cast<uint64_t>(i));
    r.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(c.max_tokens));
    r.mutable_stopping()->set_ignore_eos(c.ignore_eos);
    v1::SpeculationParameters* spec = r.mutable_speculation();
    spec->set_num_speculative_tokens(static_cast<uint32_t>(arm.k));
    spec->set_k_policy(arm.adaptive ? v1::K_POLICY_ADAPTIVE : v1::K_POLICY_FIXED);
    if (arm.k > 0 && arm.ngram) spec->set_draft_method(v1::DRAFT_METHOD_NGRAM);
    if (arm.k > 0 && arm.tree_branching > 0) {
      spec->mutable_tree()->set_branching(static_cast<uint32_t>(arm.tree_branching));
      spec->mutable_tree()->set_depth(static_cast<uint32_t>(arm.tree_depth));
    }
    if (arm.k > 0 && arm.egag.has_value()) spec->set_egag(*arm.egag);
    if (arm.guidance != bench::ArmGuidance::kOff) {
      v1::Guidance* g = r.mutable_guidance();
      g->set_scale(static_cast<float>(c.guidance_scale));
      g->set_unconditional_text(c.unconditional);
      g->set_draft(arm.guidance == bench::ArmGuidance::kTargetAndDraft);
    }
    r.set_request_id(absl::StrCat("bench-", arm.Label(), "-", i));
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::ordered_json MachineJson(const v1::GetServerInfoResponse& info) {
  nlohmann::ordered_json m;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  m["hostname"] = host;
  m["nproc"] = sysconf(_SC_NPROCESSORS_ONLN);
  utsname u;
  if (uname(&u) == 0) m["os"] = absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m["time_utc"] = when;
  std::string info_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (google::protobuf::util::MessageToJsonString(info, &info_json, options).ok()) {
    nlohmann::ordered_json parsed =
        nlohmann::ordered_json::parse(info_json, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) m["server_info"] = std::move(parsed);
  }
  return m;
}

nlohmann::ordered_json ConfigJson(const BenchConfig& c, int64_t num_prompts) {
  std::vector<nlohmann::ordered_json> arms;
  for (const bench::ArmSpec& a : c.arms) {
    arms.push_back({{"k", a.k},
                    {"k_policy", a.adaptive ? "K_POLICY_ADAPTIVE" : "K_POLICY_FIXED"},
                    {"api", a.http ? "http" : "grpc"},
                    {"label", a.Label()}});
  }
  return {{"server", c.server},
          {"http_port", c.http_port},
          {"streams", c.streams},
          {"requests_per_arm_per_repeat", c.requests},
          {"repeats", c.repeats},
          {"warmup_requests_per_arm", c.warmup},
          {"rate_requests_per_s", c.rate},
          {"arrival", c.rate > 0 ? c.arrival_name : std::string("closed_loop")},
          {"max_tokens", c.max_tokens},
          {"ignore_eos", c.ignore_eos},
          {"temperature", c.temperature},
          {"top_k", c.top_k},
          {"top_p", c.top_p},
          {"seed", c.seed},
          {"compare", c.compare},
          {"adaptive", c.adaptive},
          {"guidance_scale", c.guidance_scale},
          {"unconditional", c.unconditional},
          {"arms", arms},
          {"prompts", c.prompts_source},
          {"num_prompts", num_prompts},
          {"percentile_method", "linear interpolation between nearest ranks (numpy default)"}};
}

absl::Status WriteJson(const std::string& path, const nlohmann::ordered_json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("--json: cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<v1::GetServerInfoResponse> ServerInfo(v1::Generation::Stub& stub,
                                                     const std::string& server, double timeout) {
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);  // the server may still be loading its workers
  ctx.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(std::min(timeout, 120.0) * 1000)));
  v1::GetServerInfoResponse info;
  const grpc::Status st = stub.GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("--server ", server, ": ", st.error_message()));
  }
  return info;
}

absl::StatusOr<bench::ScenarioOptions> ParseScenarioOptions(const Flags& args) {
  bench::ScenarioOptions o;
  SPECD_ASSIGN_OR_RETURN(o.scenario, bench::ParseScenario(args.Get("scenario")));
  if (!args.Has("baseline")) {
    return absl::InvalidArgumentError(
        "--scenario needs --baseline (the server without the feature)");
  }
  SPECD_ASSIGN_OR_RETURN(const int64_t seed, args.GetInt("seed"));
  o.seed = static_cast<uint64_t>(seed);
  if (args.Has("repeats")) {
    SPECD_ASSIGN_OR_RETURN(o.repeats, IntInRange(args, "repeats", 1, 1000));
  }
  SPECD_ASSIGN_OR_RETURN(o.timeout_seconds, args.GetDouble("timeout"));
  const bool chat = o.scenario == bench::Scenario::kChat;
  SPECD_ASSIGN_OR_RETURN(o.max_tokens,
                         IntInRange(args, chat ? "reply-tokens" : "answer-tokens", 1, 1 << 20));
  SPECD_ASSIGN_OR_RETURN(o.prefix_tokens, IntInRange(args, "prefix-tokens", 1, 1 << 24));
  SPECD_ASSIGN_OR_RETURN(o.suffix_tokens, IntInRange(args, "suffix-tokens", 1, 1 << 24));
  SPECD_ASSIGN_OR_RETURN(o.requests, IntInRange(args, "prefix-requests", 1, 100000));
  SPECD_ASSIGN_OR_RETURN(o.conversations, IntInRange(args, "conversations", 1, 4096));
  SPECD_ASSIGN_OR_RETURN(o.turns, IntInRange(args, "turns", 1, 10000));
  SPECD_ASSIGN_OR_RETURN(o.system_tokens, IntInRange(args, "system-tokens", 1, 1 << 24));
  SPECD_ASSIGN_OR_RETURN(o.user_tokens, IntInRange(args, "user-tokens", 1, 1 << 24));
  SPECD_ASSIGN_OR_RETURN(o.streams, IntInRange(args, "decode-streams", 1, 4096));
  SPECD_ASSIGN_OR_RETURN(o.stream_tokens, IntInRange(args, "stream-tokens", 1, 1 << 20));
  SPECD_ASSIGN_OR_RETURN(o.long_prompt_tokens, IntInRange(args, "long-prompt-tokens", 1, 1 << 24));
  SPECD_ASSIGN_OR_RETURN(o.long_prompt_gap_s, args.GetDouble("long-prompt-gap"));
  SPECD_ASSIGN_OR_RETURN(o.long_prompt_concurrency,
                         IntInRange(args, "long-prompt-concurrency", 1, 1024));
  if (!(o.timeout_seconds > 0 && o.timeout_seconds <= 1e6)) {
    return absl::InvalidArgumentError("--timeout must be in (0, 1e6] seconds");
  }
  if (!(o.long_prompt_gap_s >= 0 && o.long_prompt_gap_s <= 3600)) {
    return absl::InvalidArgumentError("--long-prompt-gap must be in [0, 3600] seconds");
  }
  return o;
}

// `specd bench --scenario`: bench/scenarios.h.
int RunScenarioBench(const Flags& args) {
  auto fail = [](const absl::Status& st) { return ReportError("bench", st); };
  absl::StatusOr<bench::ScenarioOptions> options = ParseScenarioOptions(args);
  if (!options.ok()) return fail(options.status());
  bench::ScenarioOptions& o = *options;
  const std::string a_address = args.Get("server");
  const std::string b_address = args.Get("baseline");
  const auto a =
      v1::Generation::NewStub(grpc::CreateChannel(a_address, grpc::InsecureChannelCredentials()));
  const auto b =
      v1::Generation::NewStub(grpc::CreateChannel(b_address, grpc::InsecureChannelCredentials()));
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(*a, a_address, o.timeout_seconds);
  if (!info.ok()) return fail(info.status());
  absl::StatusOr<v1::GetServerInfoResponse> b_info = ServerInfo(*b, b_address, o.timeout_seconds);
  if (!b_info.ok()) return fail(b_info.status());
  o.vocab_size = std::min(info->target().vocab_size(), b_info->target().vocab_size());
  o.k = static_cast<int32_t>(info->default_num_speculative_tokens());
  if (args.Has("k")) {
    absl::StatusOr<std::vector<int32_t>> ks = ParseKList(args.Get("k"));
    if (!ks.ok()) return fail(ks.status());
    if (ks->size() != 1) return fail(absl::InvalidArgumentError("--scenario takes one --k"));
    o.k = ks->front();
  }
  std::cout << "specd bench --scenario " << bench::ScenarioName(o.scenario) << ": a = " << a_address
            << ", b = " << b_address << " (baseline), target " << info->target().name() << "\n"
            << std::endl;
  absl::StatusOr<std::vector<bench::ScenarioArm>> arms =
      bench::RunScenario(*a, a_address, *b, b_address, o);
  if (!arms.ok()) return fail(arms.status());
  std::vector<bench::ScenarioSummary> summaries;
  int64_t failed = 0;
  for (const bench::ScenarioArm& arm : *arms) {
    summaries.push_back(bench::SummarizeScenarioArm(arm));
    failed += arm.failed;
    if (arm.failed > 0) {
      std::cout << arm.label << ": " << arm.failed
                << " request(s) failed; first: " << arm.first_error << "\n";
    }
  }
  std::cout << bench::FormatScenarioReport(o, summaries) << std::flush;
  if (args.Has("json")) {
    nlohmann::ordered_json j = bench::ScenarioToJson(o, summaries);
    j["machine"] = MachineJson(*info);
    j["failed_requests"] = failed;
    if (absl::Status st = WriteJson(args.Get("json"), j); !st.ok()) return fail(st);
  }
  if (failed > 0) {
    return fail(absl::UnavailableError(absl::StrCat(failed, " request(s) failed (see above)")));
  }
  return 0;
}

int RunBench(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"server", "address of a running `specd serve` (its coordinator)", "", false, true},
      {"streams", "concurrent streams (requests in flight at most)", "1"},
      {"requests", "requests per arm and repeat (default: 4 x --streams)", ""},
      {"rate", "requests/s; 0 = closed loop (each stream sends as soon as its last ends)", "0"},
      {"arrival", "with --rate: poisson or fixed (evenly spaced) arrivals", "poisson"},
      {"prompts",
       "prompt file: one prompt per line, or JSONL with \"prompt\" or \"prompt_ids\" "
       "(default: built-in story openings)",
       ""},
      {"max-tokens", "max_new_tokens of every request", "128"},
      {"ignore-eos",
       "keep generating past EOS, so every request makes --max-tokens tokens (=false: stop at EOS)",
       "true", true},
      {"temperature", "0 = greedy", "0"},
      {"top-k", "0 = off", "0"},
      {"top-p", "nucleus mass in (0, 1]", "1"},
      {"seed", "request i of every arm uses seed + i", "0"},
      {"k", "K values, comma-separated, e.g. 4 or 1,2,4,8 (default: the server's default K)", ""},
      {"arms",
       "instead of --k: arms separated by ';', each k=N plus any of adaptive, ngram (prompt "
       "lookup), tree=BxD (a draft tree), egag, no-egag; e.g. \"k=4;k=4,tree=2x2;k=14\"",
       ""},
      {"compare", "also run K = 0, alternating with the K arms, and report speed-ups", "", true},
      {"adaptive", "K > 0 arms ask for K_POLICY_ADAPTIVE instead of FIXED", "", true},
      {"repeats", "rounds over all arms (default: 3 with --compare, else 1)", ""},
      {"warmup", "unrecorded requests per arm before the first round (default: --streams)", ""},
      {"http",
       "127.0.0.1:PORT of the same server's HTTP API: run every arm over it too and report the "
       "added latency per token and the throughput of HTTP against gRPC",
       ""},
      {"json", "write every number, the configuration and the machine to this file", ""},
      {"timeout", "seconds a request may take", "600"},
      {"quiet", "no progress display", "", true},
      {"guidance-scale", "add classifier-free guidance arms at this scale, in (0, 10]", "0"},
      {"unconditional", "with --guidance-scale: the unconditional prompt (empty: BOS)", ""},
      {"scenario",
       "instead of K arms, a prefix-caching, prefix-sharing or chunked-prefill workload on "
       "--server and --baseline side by side: shared-prefix, burst, chat or long-prompts (see "
       "below)",
       ""},
      {"baseline", "with --scenario: the server without the feature", ""},
      {"prefix-tokens", "shared-prefix and burst: tokens of the shared prefix", "800"},
      {"suffix-tokens", "shared-prefix and burst: tokens of each request's own suffix", "64"},
      {"prefix-requests",
       "shared-prefix: requests after the warm-up, one at a time; burst: requests at once", "8"},
      {"answer-tokens", "shared-prefix, burst and long-prompts: tokens each such request generates",
       "16"},
      {"conversations", "chat: conversations, all at once", "8"},
      {"turns", "chat: turns per conversation, each resending the history", "6"},
      {"system-tokens", "chat: tokens of the system prompt every conversation starts with", "160"},
      {"user-tokens", "chat: tokens of each user turn", "48"},
      {"reply-tokens", "chat: tokens of each reply", "32"},
      {"decode-streams", "long-prompts: streams decoding while the long prompts arrive", "8"},
      {"stream-tokens", "long-prompts: tokens each decoding stream generates", "160"},
      {"long-prompt-tokens", "long-prompts: tokens of each long prompt", "800"},
      {"long-prompt-gap", "long-prompts: seconds from one long prompt's end to the next", "0.5"},
      {"long-prompt-concurrency",
       "long-prompts: long prompts in flight at once, each sender sending one after another", "1"},
  };
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("bench", kHelp, argv, flags, &exit_code);
  if (!args) return exit_code;
  auto fail = [](const absl::Status& st) { return ReportError("bench", st); };
  if (args->Has("scenario")) return RunScenarioBench(*args);
  absl::StatusOr<BenchConfig> config = ParseConfig(*args);
  if (!config.ok()) return fail(config.status());
  BenchConfig& c = *config;

  std::vector<Prompt> prompts;
  if (args->Has("prompts")) {
    absl::StatusOr<std::vector<Prompt>> loaded = LoadPrompts(args->Get("prompts"));
    if (!loaded.ok()) return fail(loaded.status());
    prompts = *std::move(loaded);
    c.prompts_source = args->Get("prompts");
  }

  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(c.server, grpc::InsecureChannelCredentials());
  const std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(*stub, c.server, c.timeout);
  if (!info.ok()) return fail(info.status());
  if (absl::Status st = ResolveArms(*info, c); !st.ok()) return fail(st);
  if (prompts.empty()) {
    prompts = BuiltinPrompts(*stub, info->target().vocab_size());
    c.prompts_source = prompts.front().is_ids ? "built-in token ids" : "built-in text";
  }

  std::cout << "specd bench: " << c.server << ", target " << info->target().name() << " ("
            << info->target().num_layers() << " layers), draft "
            << (info->draft().name().empty() ? std::string("none") : info->draft().name()) << " ("
            << info->draft().num_layers() << " layers)\n"
            << c.streams << " stream(s), " << c.requests << " requests x " << c.repeats
            << " repeat(s) per arm, " << c.max_tokens << " max tokens, "
            << (c.rate > 0 ? absl::StrCat(c.rate, " req/s (", c.arrival_name, ")")
                           : std::string("closed loop"))
            << ", temperature " << c.temperature << "\n"
            << std::endl;

  bench::LoadOptions load;
  load.streams = c.streams;
  load.rate = c.rate;
  load.arrival = c.arrival;
  load.arrival_seed = c.seed;
  load.timeout_seconds = c.timeout;
  const int64_t total = static_cast<int64_t>(c.arms.size()) * (c.warmup + c.repeats * c.requests);
  int64_t done = 0;
  std::optional<Progress> progress;
  if (!c.quiet) progress.emplace("bench");
  auto tick = [&] {
    ++done;
    if (progress) progress->Update(done, total, "requests");
  };

  const bench::SendOne send_http = [port = c.http_port](const v1::GenerateRequest& request,
                                                        int64_t index, double timeout,
                                                        std::chrono::steady_clock::time_point t0) {
    return bench::RunOneHttp(port, request, index, timeout, t0);
  };
  auto run_load = [&](const bench::ArmSpec& arm, const std::vector<v1::GenerateRequest>& reqs,
                      const bench::LoadOptions& options) {
    return arm.http ? bench::RunLoad(send_http, reqs, options, tick)
                    : bench::RunLoad(*stub, reqs, options, tick);
  };
  std::vector<std::vector<v1::GenerateRequest>> requests;
  for (const bench::ArmSpec& arm : c.arms) {
    requests.push_back(BuildRequests(c, arm, prompts, c.requests));
    if (c.warmup > 0) {
      // Warm-up pays for first-touch page faults and connection set-up in every arm alike.
      bench::LoadOptions warm = load;
      warm.rate = 0;
      const bench::LoadRun run = run_load(arm, BuildRequests(c, arm, prompts, c.warmup), warm);
      for (const bench::RequestOutcome& o : run.outcomes) {
        if (!o.status.ok()) {
          if (progress) progress->Done();
          return fail(absl::Status(o.status.code(),
                                   absl::StrCat(arm.Label(), " warm-up: ", o.status.message())));
        }
      }
    }
  }
  std::vector<std::vector<bench::LoadRun>> runs(c.arms.size());
  for (int64_t r = 0; r < c.repeats; ++r) {
    for (size_t a = 0; a < c.arms.size(); ++a) {
      runs[a].push_back(run_load(c.arms[a], requests[a], load));
    }
  }
  if (progress) progress->Done();

  std::vector<bench::ArmSummary> arms;
  for (size_t a = 0; a < c.arms.size(); ++a)
    arms.push_back(bench::SummarizeArm(c.arms[a], runs[a]));
  std::vector<bench::CompareRow> compare;
  if (c.compare) {
    // Speed-ups within one API and one target: each K arm against K = 0 over the same transport,
    // a guided one (whatever guides its draft) against K=0 cfg.
    for (size_t a = 1; a < arms.size(); ++a) {
      const bool guided = arms[a].arm.guidance != bench::ArmGuidance::kOff;
      for (size_t b = 0; b < a; ++b) {
        if (arms[b].arm.k == 0 && arms[b].arm.http == arms[a].arm.http && arms[a].arm.k > 0 &&
            (arms[b].arm.guidance != bench::ArmGuidance::kOff) == guided) {
          compare.push_back(bench::CompareArm(arms[b], arms[a]));
        }
      }
    }
  }
  std::vector<bench::TransportRow> transport;
  for (size_t a = 0; a + 1 < arms.size(); ++a) {
    if (!arms[a].arm.http && arms[a + 1].arm.http) {
      transport.push_back(bench::CompareTransport(arms[a], arms[a + 1]));
    }
  }
  const std::vector<bench::GuidanceRow> guidance = bench::CompareGuidance(arms);
  std::cout << bench::FormatReport(arms, compare, c.repeats, transport, guidance) << std::flush;

  int64_t failed = 0;
  for (const bench::ArmSummary& a : arms) failed += a.failed;
  if (!c.json_path.empty()) {
    nlohmann::ordered_json j;
    j["config"] = ConfigJson(c, static_cast<int64_t>(prompts.size()));
    j["machine"] = MachineJson(*info);
    j["arms"] = nlohmann::ordered_json::array();
    for (const bench::ArmSummary& a : arms) j["arms"].push_back(bench::ArmToJson(a));
    j["compare"] = nlohmann::ordered_json::array();
    for (const bench::CompareRow& r : compare) j["compare"].push_back(bench::CompareToJson(r));
    j["http_vs_grpc"] = nlohmann::ordered_json::array();
    for (const bench::TransportRow& r : transport) {
      j["http_vs_grpc"].push_back(bench::TransportToJson(r, c.streams));
    }
    j["guidance"] = nlohmann::ordered_json::array();
    for (const bench::GuidanceRow& r : guidance) j["guidance"].push_back(bench::GuidanceToJson(r));
    j["failed_requests"] = failed;
    if (absl::Status st = WriteJson(c.json_path, j); !st.ok()) return fail(st);
  }
  if (failed > 0) {
    return fail(absl::UnavailableError(absl::StrCat(failed, " request(s) failed (see above)")));
  }
  return 0;
}

const CommandRegistration kRegistration({"bench", kSummary, RunBench});

}  // namespace
}  // namespace specd::cli
