// `specd bench` as a user runs it, against `specd serve` over a tiny synthetic pair: the JSON it
// writes must be complete and agree with itself and with what was asked for.
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using testing::ScopedTempDir;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult RunSpecd(const std::string& args) {
  const std::string cmd =
      absl::StrCat(testing::BuiltBinary("tools/specd").string(), " ", args, " 2>&1");
  RunResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

nlohmann::json ReadJson(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

double MedianOf3(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[1];
}

class BenchCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = *ShapePreset("tiny");
    ASSERT_TRUE(WriteSyntheticModel(spec, tmp_->path() / "m").ok());
    auto serve = ChildProcess::Start(
        testing::BuiltBinary("tools/specd"),
        {"serve", "--target", (tmp_->path() / "m").string(), "--draft-exit-layer", "2", "--listen",
         "127.0.0.1:0", "--threads", "1", "--kv-tokens", "4096", "--http-listen", "127.0.0.1:0"});
    ASSERT_TRUE(serve.ok()) << serve.status();
    serve_ = serve->release();
  }
  static void TearDownTestSuite() {
    if (serve_ != nullptr) {
      // SIGTERM, not the destructor's SIGKILL: `specd serve` then stops its three children.
      EXPECT_EQ(serve_->Terminate(), 0);
      delete serve_;
      serve_ = nullptr;
    }
    delete tmp_;
  }
  void SetUp() override {
    if (serve_ == nullptr) GTEST_SKIP() << "specd serve did not start";
  }

  static ScopedTempDir* tmp_;
  static ChildProcess* serve_;
};

ScopedTempDir* BenchCliTest::tmp_ = nullptr;
ChildProcess* BenchCliTest::serve_ = nullptr;

TEST_F(BenchCliTest, CompareWritesConsistentJson) {
  const std::filesystem::path json = tmp_->path() / "compare.json";
  const RunResult r =
      RunSpecd(absl::StrCat("bench --server ", serve_->address(),
                            " --compare --k 2 --streams 2 --max-tokens 16 --json ", json.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("K=0"));
  EXPECT_THAT(r.output, HasSubstr("K=2"));
  EXPECT_THAT(r.output, HasSubstr("efficiency"));
  const nlohmann::json j = ReadJson(json);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << json;

  // What was asked for, with the documented defaults: 4 requests per stream, 3 repeats.
  const nlohmann::json& c = j["config"];
  EXPECT_EQ(c["streams"], 2);
  EXPECT_EQ(c["requests_per_arm_per_repeat"], 8);
  EXPECT_EQ(c["repeats"], 3);
  EXPECT_EQ(c["max_tokens"], 16);
  EXPECT_EQ(c["ignore_eos"], true);
  EXPECT_EQ(c["arrival"], "closed_loop");
  EXPECT_FALSE(j["machine"]["hostname"].get<std::string>().empty());
  EXPECT_GE(j["machine"]["nproc"].get<int64_t>(), 1);
  EXPECT_EQ(j["machine"]["server_info"]["target"]["num_layers"], 4);
  EXPECT_EQ(j["machine"]["server_info"]["draft"]["num_layers"], 2);
  EXPECT_EQ(j["failed_requests"], 0);

  const nlohmann::json& arms = j["arms"];
  ASSERT_EQ(arms.size(), 2u);
  EXPECT_EQ(arms[0]["k"], 0);
  EXPECT_EQ(arms[1]["k"], 2);
  for (const nlohmann::json& a : arms) {
    const std::string arm = a["label"].get<std::string>();
    EXPECT_EQ(a["k_policy"], "K_POLICY_FIXED") << arm;
    EXPECT_EQ(a["requests"], 8 * 3) << arm;
    EXPECT_EQ(a["failed"], 0) << arm;
    // EOS is ignored, so every request makes exactly max tokens.
    EXPECT_EQ(a["output_tokens"], 8 * 3 * 16) << arm;
    EXPECT_EQ(a["finish_reasons"]["FINISH_REASON_LENGTH"], 8 * 3) << arm;
    const std::vector<double> per_repeat = a["repeat_output_tokens_per_s"];
    ASSERT_EQ(per_repeat.size(), 3u) << arm;
    EXPECT_DOUBLE_EQ(a["output_tokens_per_s"].get<double>(), MedianOf3(per_repeat)) << arm;
    const std::vector<double> walls = a["repeat_wall_s"];
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(per_repeat[i] * walls[i], 8 * 16, 1e-6) << arm;
    EXPECT_EQ(a["ttft_ms"]["count"], 8 * 3) << arm;
    EXPECT_EQ(a["tpot_ms"]["count"], 8 * 3) << arm;
    EXPECT_GT(a["itl_ms"]["count"].get<int64_t>(), 0) << arm;
    EXPECT_LE(a["ttft_ms"]["p50"].get<double>(), a["ttft_ms"]["p99"].get<double>()) << arm;
    EXPECT_LE(a["ttft_ms"]["p99"].get<double>(), a["e2e_latency_ms"]["p99"].get<double>()) << arm;
    const nlohmann::json& u = a["usage"];
    // At most K + 1 tokens a round, the last round's surplus cut at max tokens.
    const int64_t rounds = u["rounds"];
    EXPECT_GE(rounds, 8 * 3 * 16 / (a["k"].get<int64_t>() + 1)) << arm;
    EXPECT_LE(a["output_tokens"].get<int64_t>(), u["accepted_tokens"].get<int64_t>() + rounds)
        << arm;
    EXPECT_DOUBLE_EQ(a["mean_accepted_length"].get<double>(),
                     (u["accepted_tokens"].get<double>() + rounds) / rounds)
        << arm;
    // The workers' timings: every decode round is timed, and forward passes fit inside rounds.
    const nlohmann::json& t = a["timings"];
    ASSERT_GT(t["rounds"].get<int64_t>(), 0) << arm << ": Usage.timings is empty";
    EXPECT_LE(t["rounds"].get<int64_t>(), rounds) << arm;
    EXPECT_NEAR(a["verify_forward_ms"].get<double>(),
                t["verify_forward_ns"].get<double>() / t["rounds"].get<double>() / 1e6, 1e-9);
    EXPECT_GT(a["verify_forward_ms"].get<double>(), 0) << arm;
    EXPECT_GE(a["overhead_fraction"].get<double>(), 0) << arm;
    EXPECT_LT(a["overhead_fraction"].get<double>(), 1) << arm;
  }

  // Plain decoding drafts nothing: one token a round and no acceptance figures.
  const nlohmann::json& plain = arms[0];
  EXPECT_EQ(plain["usage"]["draft_tokens"], 0);
  EXPECT_EQ(plain["usage"]["drafting_rounds"], 0);
  EXPECT_TRUE(plain["alpha"].is_null());
  EXPECT_TRUE(plain["acceptance_rate"].is_null());
  EXPECT_TRUE(plain["per_position_acceptance"].empty());
  EXPECT_TRUE(plain["draft_step_ms"].is_null());
  EXPECT_DOUBLE_EQ(plain["mean_accepted_length"].get<double>(), 1.0);

  // K = 2: at most two drafts a round (the server may draft fewer where max tokens is near),
  // acceptance figures consistent with the counts.
  const nlohmann::json& spec = arms[1];
  const nlohmann::json& u = spec["usage"];
  EXPECT_LE(u["draft_tokens"].get<int64_t>(), 2 * u["drafting_rounds"].get<int64_t>());
  EXPECT_GE(u["draft_tokens"].get<int64_t>(), u["drafting_rounds"].get<int64_t>());
  EXPECT_LE(u["accepted_tokens"].get<int64_t>(), u["draft_tokens"].get<int64_t>());
  EXPECT_DOUBLE_EQ(spec["acceptance_rate"].get<double>(),
                   u["accepted_tokens"].get<double>() / u["draft_tokens"].get<double>());
  const std::vector<double> per_position = spec["per_position_acceptance"];
  ASSERT_EQ(per_position.size(), 2u);
  EXPECT_GE(per_position[0], per_position[1]);  // draft 2 is accepted only after draft 1
  EXPECT_GE(spec["alpha"].get<double>(), spec["acceptance_rate"].get<double>());
  EXPECT_LE(spec["alpha"].get<double>(), 1.0);
  EXPECT_GT(spec["mean_k"].get<double>(), 1.0);
  EXPECT_LE(spec["mean_k"].get<double>(), 2.0);
  EXPECT_GT(spec["draft_step_ms"].get<double>(), 0);

  ASSERT_EQ(j["compare"].size(), 1u);
  const nlohmann::json& row = j["compare"][0];
  EXPECT_EQ(row["k"], 2);
  EXPECT_DOUBLE_EQ(
      row["measured_speedup"].get<double>(),
      spec["output_tokens_per_s"].get<double>() / plain["output_tokens_per_s"].get<double>());
  EXPECT_DOUBLE_EQ(row["target_step_ms"].get<double>(), plain["verify_forward_ms"].get<double>());
  EXPECT_DOUBLE_EQ(row["verify_step_ms"].get<double>(), spec["verify_forward_ms"].get<double>());
  EXPECT_DOUBLE_EQ(row["alpha"].get<double>(), spec["alpha"].get<double>());
  EXPECT_NEAR(row["efficiency"].get<double>(),
              row["measured_speedup"].get<double>() / row["engine_limited_speedup"].get<double>(),
              1e-12);
  EXPECT_GT(row["ideal_speedup"].get<double>(), 0);
}

TEST_F(BenchCliTest, FixedRateWithPromptFileAndAdaptiveK) {
  const std::filesystem::path prompts = tmp_->path() / "prompts.jsonl";
  std::ofstream(prompts) << "the cat sat\n\n{\"prompt_ids\": [1, 50, 60, 70]}\n"
                         << "{\"prompt\": \"a dog\"}\n";
  const std::filesystem::path json = tmp_->path() / "rate.json";
  const RunResult r = RunSpecd(absl::StrCat(
      "bench --server ", serve_->address(), " --k 3 --adaptive --streams 2 --requests 6 ",
      "--rate 200 --arrival fixed --max-tokens 8 --warmup 0 --quiet --prompts ", prompts.string(),
      " --json ", json.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ReadJson(json);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["config"]["arrival"], "fixed");
  EXPECT_EQ(j["config"]["num_prompts"], 3);
  ASSERT_EQ(j["arms"].size(), 1u);
  EXPECT_EQ(j["arms"][0]["k_policy"], "K_POLICY_ADAPTIVE");
  EXPECT_EQ(j["arms"][0]["output_tokens"], 6 * 8);
  EXPECT_TRUE(j["compare"].empty());
}

// --guidance-scale: every unguided arm gets its guided twins, and each guided arm is set against
// the unguided arm of its K.
TEST_F(BenchCliTest, GuidanceArmsSitBesideTheUnguidedOnes) {
  const std::filesystem::path json = tmp_->path() / "guidance.json";
  const RunResult r = RunSpecd(absl::StrCat(
      "bench --server ", serve_->address(),
      " --compare --k 2 --streams 2 --requests 4 --repeats 1 --warmup 0 --max-tokens 8 --quiet",
      " --guidance-scale 3 --unconditional 'a dog' --json ", json.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("classifier-free guidance against the unguided arm"));
  const nlohmann::json j = ReadJson(json);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["config"]["guidance_scale"], 3.0);
  EXPECT_EQ(j["config"]["unconditional"], "a dog");
  const std::vector<std::string> labels = {"K=0", "K=0 cfg", "K=2", "K=2 cfg", "K=2 cfg+draft"};
  const std::vector<std::string> guidance = {"off", "target", "off", "target", "target_and_draft"};
  ASSERT_EQ(j["arms"].size(), labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    EXPECT_EQ(j["arms"][i]["label"], labels[i]);
    EXPECT_EQ(j["arms"][i]["guidance"], guidance[i]);
    EXPECT_EQ(j["arms"][i]["output_tokens"], 4 * 8) << labels[i];
  }
  // Three guided arms, each against the unguided arm of its K; three speed-up rows, K=2 against
  // K=0 and both guided K=2 arms against K=0 cfg.
  const nlohmann::json& g = j["guidance"];
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0]["label"], "K=0 cfg");
  EXPECT_EQ(g[2]["label"], "K=2 cfg+draft");
  EXPECT_NEAR(g[1]["throughput_ratio"].get<double>(),
              g[1]["output_tokens_per_s"].get<double>() /
                  g[1]["unguided_output_tokens_per_s"].get<double>(),
              1e-12);
  EXPECT_EQ(g[2]["unguided_alpha"].get<double>(), j["arms"][2]["alpha"].get<double>());
  EXPECT_EQ(j["compare"].size(), 3u);
}

// --scenario on two servers (here the same one twice: the test is about the bookkeeping, the
// ratios are what the benchmark script measures). Every count follows from the flags.
TEST_F(BenchCliTest, ScenariosWriteConsistentJson) {
  const std::string servers =
      absl::StrCat("--server ", serve_->address(), " --baseline ", serve_->address());
  struct Case {
    std::string scenario, flags;
    int64_t requests, output_tokens;
    std::vector<std::string> ratios;
  };
  const std::vector<Case> cases = {
      {"shared-prefix",
       "--prefix-tokens 48 --suffix-tokens 8 --prefix-requests 3 --answer-tokens 4",
       3,
       3 * 4,
       {"ttft_mean", "ttft_p50", "ttft_p99"}},
      {"burst",
       "--prefix-tokens 48 --suffix-tokens 8 --prefix-requests 3 --answer-tokens 4",
       3,
       3 * 4,
       {"ttft_mean", "ttft_p99", "output_tokens_per_s"}},
      {"chat",
       "--conversations 2 --turns 2 --system-tokens 16 --user-tokens 8 --reply-tokens 4",
       2 * 2,
       2 * 2 * 4,
       {"output_tokens_per_s", "ttft_p50", "ttft_p99"}},
      // Streams long enough that a long prompt is sent while they decode, however late its
      // sender thread runs on a loaded machine (otherwise there is no long-prompt TTFT).
      {"long-prompts",
       "--decode-streams 2 --stream-tokens 200 --long-prompt-tokens 64 --answer-tokens 2 "
       "--long-prompt-gap 0 --long-prompt-concurrency 3",
       2,
       2 * 200,
       {"itl_p99", "itl_p50", "long_prompt_ttft_mean"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scenario);
    const std::filesystem::path json = tmp_->path() / (c.scenario + ".json");
    const RunResult r = RunSpecd(absl::StrCat("bench --scenario ", c.scenario, " ", servers, " ",
                                              c.flags, " --k 2 --json ", json.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("a / b:"));
    const nlohmann::json j = ReadJson(json);
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j["scenario"], c.scenario);
    EXPECT_EQ(j["config"]["k"], 2);
    EXPECT_EQ(j["failed_requests"], 0);
    ASSERT_EQ(j["arms"].size(), 2u);
    for (const nlohmann::json& a : j["arms"]) {
      EXPECT_EQ(a["requests"], c.requests) << a["label"];
      EXPECT_EQ(a["failed"], 0) << a["label"];
      EXPECT_EQ(a["output_tokens"], c.output_tokens) << a["label"];
      EXPECT_EQ(a["ttft_ms"]["count"], c.requests) << a["label"];
    }
    for (const std::string& ratio : c.ratios) {
      ASSERT_TRUE(j["a_over_b"].contains(ratio)) << ratio;
      EXPECT_GT(j["a_over_b"][ratio].get<double>(), 0) << ratio;
    }
  }
  // A chat or burst arm's throughput is its one repeat's tokens over that repeat's wall time.
  for (const std::string name : {"chat", "burst"}) {
    const nlohmann::json j = ReadJson(tmp_->path() / (name + ".json"));
    for (const nlohmann::json& a : j["arms"]) {
      ASSERT_EQ(a["repeat_output_tokens_per_s"].size(), 1u) << name;
      EXPECT_DOUBLE_EQ(a["output_tokens_per_s"].get<double>(),
                       a["repeat_output_tokens_per_s"][0].get<double>())
          << name;
    }
  }
  // Long prompts arrived while the streams decoded (from up to three senders at once), and were
  // measured apart from them.
  const nlohmann::json longp = ReadJson(tmp_->path() / "long-prompts.json");
  EXPECT_EQ(longp["config"]["long_prompt_concurrency"], 3);
  EXPECT_GT(longp["arms"][0]["long_prompt_ttft_ms"]["count"].get<int64_t>(), 0);
  EXPECT_GT(longp["arms"][0]["itl_ms"]["count"].get<int64_t>(), 0);
}

// --http: every arm also over the HTTP API, alternating, with the HTTP-against-gRPC rows.
TEST_F(BenchCliTest, HttpModeMeasuresBothApisInOneRun) {
  ASSERT_GT(serve_->http_port(), 0);
  const std::filesystem::path json = tmp_->path() / "http.json";
  const RunResult r = RunSpecd(
      absl::StrCat("bench --server ", serve_->address(), " --http 127.0.0.1:", serve_->http_port(),
                   " --k 0,2 --streams 4 --requests 8 --max-tokens 12 --repeats 2 --quiet --json ",
                   json.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("K=2 http"));
  EXPECT_THAT(r.output, HasSubstr("added ms/tok"));
  const nlohmann::json j = ReadJson(json);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["failed_requests"], 0);
  const nlohmann::json& arms = j["arms"];
  ASSERT_EQ(arms.size(), 4u);
  for (size_t a = 0; a < 4; ++a) {
    EXPECT_EQ(arms[a]["api"], a % 2 == 0 ? "grpc" : "http");
    EXPECT_EQ(arms[a]["k"], a < 2 ? 0 : 2);
    // Both APIs deliver every token and the usage (greedy: the same output).
    EXPECT_EQ(arms[a]["output_tokens"], 2 * 8 * 12) << arms[a]["label"];
    EXPECT_EQ(arms[a]["requests"], 16);
  }
  // The same requests, greedy with a fixed K: the same drafting work over either API.
  EXPECT_EQ(arms[3]["usage"]["draft_tokens"], arms[2]["usage"]["draft_tokens"]);
  EXPECT_GT(arms[3]["usage"]["draft_tokens"].get<int64_t>(), 0);
  const nlohmann::json& rows = j["http_vs_grpc"];
  ASSERT_EQ(rows.size(), 2u);
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["streams"], 4);
    EXPECT_GT(row["grpc_tpot_mean_ms"].get<double>(), 0.0);
    EXPECT_GT(row["http_tpot_mean_ms"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(
        row["http_added_ms_per_token"].get<double>(),
        row["http_tpot_mean_ms"].get<double>() - row["grpc_tpot_mean_ms"].get<double>());
    EXPECT_GT(row["http_to_grpc_throughput"].get<double>(), 0.0);
  }
  // Only a loopback address is taken.
  const RunResult bad = RunSpecd(
      absl::StrCat("bench --server ", serve_->address(), " --http example.com:80 --quiet"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--http takes the loopback address"));
}

TEST(BenchCliFlagsTest, BadInputIsAClearError) {
  RunResult r = RunSpecd("bench --server 127.0.0.1:1 --streams 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--streams must be in [1, 4096], got 0"));
  r = RunSpecd("bench --server 127.0.0.1:1 --k 2,x");
  EXPECT_EQ(r.exit_code, 2);
  r = RunSpecd("bench --server 127.0.0.1:1 --rate fast");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--rate must be a number"));
  r = RunSpecd("bench --server 127.0.0.1:1 --prompts /nonexistent/prompts.txt");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("/nonexistent/prompts.txt"));
  ScopedTempDir tmp;
  std::ofstream(tmp.path() / "bad.jsonl") << "{\"prompt_ids\": [1, -4]}\n";
  r = RunSpecd(
      absl::StrCat("bench --server 127.0.0.1:1 --prompts ", (tmp.path() / "bad.jsonl").string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("bad.jsonl:1"));
  r = RunSpecd("bench --server 127.0.0.1:1 --timeout 0.5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--server 127.0.0.1:1"));
  r = RunSpecd("bench --server 127.0.0.1:1 --scenario lunch");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(
      r.output,
      HasSubstr("--scenario must be shared-prefix, burst, chat or long-prompts, got 'lunch'"));
  r = RunSpecd("bench --server 127.0.0.1:1 --scenario chat");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--scenario needs --baseline"));
  r = RunSpecd("bench --server 127.0.0.1:1 --baseline 127.0.0.1:2 --scenario chat --turns 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--turns must be in [1, 10000], got 0"));
  r = RunSpecd("bench --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("Leviathan"));
}

}  // namespace
}  // namespace specd
