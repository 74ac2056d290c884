// The coordinator's /metrics as a real Prometheus (Debian's `prometheus`) sees them: three specd
// processes on loopback run a known workload while Prometheus scrapes every second. The PromQL
// acceptance rate must match the one computed from the responses' usage fields, the per-position
// series must be present and monotone, and every query of the Grafana dashboard must run.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "specd/v1/generation.grpc.pb.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

extern char** environ;

namespace specd {
namespace {

using testing::ChildProcess;
using testing::ScopedTempDir;
using json = nlohmann::json;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr int kNumPositions = 4;  // K of the workload

// A port the kernel considers free right now (Prometheus takes no port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// A Prometheus server on 127.0.0.1 with its own data directory; killed when destroyed.
class PrometheusServer {
 public:
  PrometheusServer(const std::filesystem::path& dir, const std::string& config) : dir_(dir) {
    port_ = FreePort();
    std::ofstream(dir / "prometheus.yml") << config;
    const std::vector<std::string> args = {
        kPrometheus, absl::StrCat("--config.file=", (dir / "prometheus.yml").string()),
        absl::StrCat("--storage.tsdb.path=", (dir / "data").string()),
        absl::StrCat("--web.listen-address=127.0.0.1:", port_), "--log.level=warn"};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = (dir / "prometheus.log").string();
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, kPrometheus, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~PrometheusServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool started() const { return pid_ > 0; }
  std::string Log() const {
    std::ifstream f(dir_ / "prometheus.log");
    return std::string(std::istreambuf_iterator<char>(f), {});
  }

  // GET /api/v1/<path>; the parsed body, or a discarded json when unreachable or not JSON.
  json Api(const std::string& path) const {
    absl::StatusOr<std::string> body = testing::HttpGet(port_, "/api/v1/" + path);
    if (!body.ok()) return json(json::value_t::discarded);
    return json::parse(*body, nullptr, /*allow_exceptions=*/false);
  }
  json Query(const std::string& promql) const { return Api("query?query=" + UrlEncode(promql)); }

  bool WaitReady() const {
    for (int i = 0; i < 300; ++i) {
      if (testing::HttpGet(port_, "/-/ready").ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// The single value of an instant-vector query, or -1 when the result is not exactly one sample.
double Scalar(const json& r) {
  if (r.is_discarded() || r.value("status", "") != "success") return -1;
  const json& result = r["data"]["result"];
  if (result.size() != 1) return -1;
  return std::stod(result[0]["value"][1].get<std::string>());
}

bool WaitServing(ChildProcess& coordinator) {
  auto health = grpc::health::v1::Health::NewStub(coordinator.Channel());
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse reply;
    if (health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &reply).ok() &&
        reply.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(PrometheusTest, PromqlAcceptanceRateMatchesUsageAndDashboardQueriesRun) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  if (!std::filesystem::exists(kPrometheus)) {
    GTEST_SKIP() << kPrometheus << " is missing (Debian package prometheus)";
  }
  ScopedTempDir tmp;
  const std::filesystem::path model = tmp.path() / "stories260K";
  ASSERT_TRUE(testing::PrepareModel(testing::ModelKind::kStories260K, model).ok());
  // The target on this host's socket path, the draft on gRPC only.
  auto target = ChildProcess::Start(
      testing::TargetWorkerBinary(),
      testing::WorkerArgs(model, {"--local-socket", (tmp.path() / "target.sock").string()}));
  ASSERT_TRUE(target.ok()) << target.status();
  auto draft = ChildProcess::Start(
      testing::DraftWorkerBinary(),
      testing::WorkerArgs(model, {"--exit-layer", std::to_string(testing::DraftExitLayer(
                                                      testing::ModelKind::kStories260K))}));
  ASSERT_TRUE(draft.ok()) << draft.status();
  auto coordinator =
      ChildProcess::Start(testing::BuiltBinary("services/coordinator/specd-coordinator"),
                          {"--listen", "127.0.0.1:0", "--target", (*target)->address(), "--draft",
                           (*draft)->address(), "--metrics-port", "0"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_GT((*coordinator)->metrics_port(), 0);
  ASSERT_TRUE(WaitServing(**coordinator)) << (*coordinator)->StderrText();

  const std::string config = absl::StrCat(
      "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
      "scrape_configs:\n"
      "  - job_name: specd-coordinator\n"
      "    static_configs: [{targets: ['127.0.0.1:",
      (*coordinator)->metrics_port(),
      "']}]\n"
      "  - job_name: specd-workers\n"
      "    static_configs:\n"
      "      - {targets: ['127.0.0.1:",
      (*draft)->metrics_port(),
      "'], labels: {worker: draft}}\n"
      "      - {targets: ['127.0.0.1:",
      (*target)->metrics_port(), "'], labels: {worker: target}}\n");
  PrometheusServer prometheus(tmp.path(), config);
  ASSERT_TRUE(prometheus.started());
  ASSERT_TRUE(prometheus.WaitReady()) << prometheus.Log();
  const auto window_start = std::chrono::steady_clock::now();
  // The window must open on a scrape of the idle coordinator and of the idle target worker,
  // whose counters are all zero: then increase() extrapolates the two counters of a ratio alike
  // and the ratio is exact. Prometheus scrapes each on its own schedule, and on a loaded machine
  // the worker's first scrape may come a while after the coordinator's.
  bool scraped = false;
  for (int i = 0; i < 100 && !scraped; ++i) {
    scraped =
        Scalar(prometheus.Query("specd_spec_decode_num_draft_tokens_total")) == 0 &&
        Scalar(prometheus.Query("specd_prefix_cache_queried_tokens_total{worker=\"target\"}")) == 0;
    if (!scraped) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(scraped) << prometheus.Log();

  // The workload: sampled requests with different seeds, so acceptance is neither 0 nor 1.
  auto stub = v1::Generation::NewStub((*coordinator)->Channel());
  int64_t drafted = 0;
  // Rounds with K > 0: a request's last token is plain decoding (K trimmed to what it still needs).
  int64_t drafting_rounds = 0;
  int64_t accepted = 0;
  std::vector<int64_t> per_position(kNumPositions, 0);
  for (int i = 0; i < 6; ++i) {
    v1::GenerateRequest r;
    r.set_text(i % 2 == 0 ? "Once upon a time" : "The little dog");
    r.mutable_stopping()->set_max_new_tokens(48);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(kNumPositions);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_seed(static_cast<uint64_t>(100 + i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse msg;
    v1::Usage usage;
    while (reader->Read(&msg)) {
      if (msg.has_usage()) usage = msg.usage();
    }
    const grpc::Status st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    drafted += usage.draft_tokens();
    drafting_rounds += usage.drafting_rounds();
    accepted += usage.accepted_tokens();
    for (int k = 0; k < usage.accepted_per_position_size() && k < kNumPositions; ++k) {
      per_position[static_cast<size_t>(k)] += usage.accepted_per_position(k);
    }
  }
  // A workload whose rate is neither 0 nor 1 tells the two counters apart.
  ASSERT_GT(accepted, 0);
  ASSERT_LT(accepted, drafted);
  const double usage_rate = static_cast<double>(accepted) / static_cast<double>(drafted);

  // Wait for a scrape that saw the whole workload.
  bool caught_up = false;
  for (int i = 0; i < 100 && !caught_up; ++i) {
    caught_up = Scalar(prometheus.Query("specd_spec_decode_num_draft_tokens_total")) ==
                static_cast<double>(drafted);
    if (!caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(caught_up) << "Prometheus never saw " << drafted << " draft tokens";
  const int64_t window_s = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::steady_clock::now() - window_start)
                               .count() +
                           3;
  const std::string w = absl::StrCat("[", window_s, "s]");
  const double promql_rate = Scalar(prometheus.Query(
      absl::StrCat("increase(specd_spec_decode_num_accepted_tokens_total", w,
                   ") / increase(specd_spec_decode_num_draft_tokens_total", w, ")")));
  EXPECT_NEAR(promql_rate, usage_rate, 0.01 * usage_rate)
      << "usage says " << accepted << " / " << drafted;
  EXPECT_EQ(Scalar(prometheus.Query("specd_spec_decode_num_accepted_tokens_total")),
            static_cast<double>(accepted));
  EXPECT_EQ(Scalar(prometheus.Query("specd_spec_decode_num_drafts_total")),
            static_cast<double>(drafting_rounds));

  // The hooks beyond the counters fired: phases, RPCs to both workers, finished requests.
  for (const char* q : {"specd_round_phase_duration_seconds_count{phase=\"verify\"}",
                        "specd_round_phase_duration_seconds_count{phase=\"draft\"}",
                        "specd_worker_rpc_request_bytes_total{worker=\"draft\"}",
                        "specd_worker_rpc_response_bytes_total{worker=\"target\"}",
                        "specd_time_to_first_token_seconds_count"}) {
    EXPECT_GT(Scalar(prometheus.Query(q)), 0) << q;
  }
  EXPECT_EQ(Scalar(prometheus.Query("specd_request_success_total{finished_reason=\"length\"}")), 6);
  // Both workers up throughout, never restarted.
  EXPECT_EQ(Scalar(prometheus.Query("min(specd_worker_up)")), 1);
  EXPECT_EQ(Scalar(prometheus.Query("count(specd_worker_up)")), 2);
  // The target's round calls take its socket; the draft, which serves none, is on gRPC.
  EXPECT_EQ(Scalar(prometheus.Query("specd_worker_local_socket{worker=\"target\"}")), 1);
  EXPECT_EQ(Scalar(prometheus.Query("specd_worker_local_socket{worker=\"draft\"}")), 0);
  EXPECT_EQ(Scalar(prometheus.Query("sum(specd_worker_restarts_total)")), 0);

  // `specd health`, as the compose health checks run it, sees the coordinator SERVING.
  std::string health_stderr;
  const absl::StatusOr<int> health =
      ChildProcess::Run(testing::BuiltBinary("tools/specd"),
                        {"health", "--server", (*coordinator)->address()}, &health_stderr);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 0) << health_stderr;

  // Per-position series: present for every position, monotone over the window, and ending at
  // the usage totals.
  const json range = prometheus.Query("specd_spec_decode_num_accepted_tokens_per_pos_total" + w);
  ASSERT_EQ(range.value("status", ""), "success") << range.dump();
  std::vector<bool> seen(kNumPositions, false);
  for (const json& series : range["data"]["result"]) {
    const int position = std::stoi(series["metric"]["position"].get<std::string>());
    double previous = 0;
    for (const json& sample : series["values"]) {
      const double v = std::stod(sample[1].get<std::string>());
      EXPECT_GE(v, previous) << "position " << position << " went down";
      previous = v;
    }
    if (position < kNumPositions) {
      seen[static_cast<size_t>(position)] = true;
      EXPECT_EQ(previous, static_cast<double>(per_position[static_cast<size_t>(position)]))
          << "position " << position;
    }
  }
  for (int k = 0; k < kNumPositions; ++k) EXPECT_TRUE(seen[k]) << "no series for position " << k;

  // Prefix caching: three requests with a 61-token prompt, one at a time. The target's catch-up
  // is the prompt in the first round and one token after, so each request queries 60 tokens;
  // the second finds the first's 3 whole blocks of 16 cached (the prompt's 4th is not whole),
  // the third shares only the first 40 tokens, so 2 blocks. Counted straight off its /metrics.
  const auto target_counter = [&](const std::string& name) {
    const absl::StatusOr<std::string> text =
        testing::HttpGet((*target)->metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    const size_t at = text.ok() ? text->find("\n" + name + " ") : std::string::npos;
    return at == std::string::npos ? -1.0 : std::stod(text->substr(at + name.size() + 2));
  };
  const double queried_before = target_counter("specd_prefix_cache_queried_tokens_total");
  const double hit_before = target_counter("specd_prefix_cache_hit_tokens_total");
  std::vector<int32_t> shared_prompt = {1};
  for (int j = 1; j < 61; ++j) shared_prompt.push_back(300 + (j * 7) % 200);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt = shared_prompt;
    if (i == 2) {
      for (int j = 40; j < 61; ++j) prompt[j] = 250 + j;
    }
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    r.mutable_stopping()->set_max_new_tokens(24);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(kNumPositions);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_seed(7);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  EXPECT_EQ(target_counter("specd_prefix_cache_queried_tokens_total") - queried_before, 180);
  EXPECT_EQ(target_counter("specd_prefix_cache_hit_tokens_total") - hit_before, 48 + 32);
  const double hits = target_counter("specd_prefix_cache_hit_tokens_total");
  const double queried = target_counter("specd_prefix_cache_queried_tokens_total");
  // The dashboard's hit rate, over the whole window, is the counters' ratio; the draft worker
  // caches on its own and hits too.
  bool seen_hits = false;
  for (int i = 0; i < 100 && !seen_hits; ++i) {
    seen_hits =
        Scalar(prometheus.Query("specd_prefix_cache_hit_tokens_total{worker=\"target\"}")) == hits;
    if (!seen_hits) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(seen_hits) << "Prometheus never saw " << hits << " hit tokens";
  const int64_t cache_window_s = std::chrono::duration_cast<std::chrono::seconds>(
                                     std::chrono::steady_clock::now() - window_start)
                                     .count() +
                                 3;
  const std::string cw = absl::StrCat("[", cache_window_s, "s]");
  const double promql_hit_rate = Scalar(prometheus.Query(absl::StrCat(
      "sum by (worker) (increase(specd_prefix_cache_hit_tokens_total{worker=\"target\"}", cw,
      ")) / sum by (worker) (increase(specd_prefix_cache_queried_tokens_total{worker=\"target\"}",
      cw, "))")));
  EXPECT_NEAR(promql_hit_rate, hits / queried, 0.01 * hits / queried);
  // Prometheus scrapes each worker on its own schedule, so the draft's hits may land a scrape
  // after the target's.
  double draft_hits = 0;
  for (int i = 0; i < 100 && draft_hits <= 0; ++i) {
    draft_hits = Scalar(prometheus.Query("specd_prefix_cache_hit_tokens_total{worker=\"draft\"}"));
    if (draft_hits <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(draft_hits, 0);
  EXPECT_GT(Scalar(prometheus.Query("specd_worker_kv_blocks_cached{worker=\"target\"}")), 0);

  // Every dashboard query parses and evaluates.
  std::ifstream f(testing::SourceDir() / "deploy/grafana/dashboards/specd.json");
  const json dashboard = json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(dashboard.is_discarded()) << "deploy/grafana/dashboards/specd.json is not JSON";
  int queries = 0;
  for (const json& panel : dashboard["panels"]) {
    for (const json& t : panel["targets"]) {
      const std::string expr = t["expr"].get<std::string>();
      const json r = prometheus.Query(expr);
      EXPECT_EQ(r.value("status", ""), "success")
          << "panel '" << panel["title"].get<std::string>() << "': " << expr << "\n"
          << r.dump();
      ++queries;
    }
  }
  EXPECT_GT(queries, 10);
}

// Three consecutive TCP ports on 127.0.0.1 that are free right now, for --metrics-port.
int FreePortRun() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int probe = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len);
    close(probe);
    const int base = ntohs(addr.sin_port);
    if (base > 65530) continue;
    bool free = true;
    for (int i = 0; i < 3 && free; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      addr.sin_port = htons(static_cast<uint16_t>(base + i));
      free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      close(fd);
    }
    if (free) return base;
  }
  return 0;
}

// `specd serve --metrics-port P` serves each process's /metrics on a fixed port and says where.
TEST(ServeMetricsTest, FixedPortsArePrintedAndServed) {
  ScopedTempDir tmp;
  const std::filesystem::path model = tmp.path() / "tiny";
  ASSERT_TRUE(testing::PrepareModel(testing::ModelKind::kSynthetic, model).ok());
  const int base = FreePortRun();
  ASSERT_GT(base, 0);
  auto serve = ChildProcess::Start(testing::BuiltBinary("tools/specd"),
                                   {"serve", "--target", model.string(), "--draft-exit-layer", "1",
                                    "--listen", "127.0.0.1:0", "--backend", "cpu", "--threads", "1",
                                    "--kv-tokens", "512", "--metrics-port", std::to_string(base)});
  ASSERT_TRUE(serve.ok()) << serve.status();
  const std::vector<std::pair<std::string, int>> expected = {
      {"target worker", base + 1}, {"draft worker", base + 2}, {"coordinator", base}};
  for (const auto& [name, port] : expected) {
    const std::string line = absl::StrCat(name, " metrics on http://127.0.0.1:", port, "/metrics");
    EXPECT_THAT((*serve)->startup_lines(), ::testing::Contains(line));
    absl::StatusOr<std::string> body = testing::HttpGet(port, "/metrics");
    ASSERT_TRUE(body.ok()) << name << ": " << body.status();
    EXPECT_THAT(*body,
                ::testing::HasSubstr(name == "coordinator" ? "specd_spec_decode_num_drafts_total"
                                                           : "specd_worker_kv_blocks"));
  }
  EXPECT_EQ((*serve)->Terminate(), 0);
}

}  // namespace
}  // namespace specd
