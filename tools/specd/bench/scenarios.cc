#include "tools/specd/bench/scenarios.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd::bench {
namespace {

using Clock = std::chrono::steady_clock;

// `n` token ids in [3, vocab) from a splitmix64 stream named by `key`: the same key gives the
// same ids on every run and every server.
std::vector<int32_t> Ids(uint64_t key, int64_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  uint64_t x = key;
  const uint64_t range = static_cast<uint64_t>(std::max<int64_t>(vocab - 3, 1));
  for (int64_t i = 0; i < n; ++i) {
    x += 0x9E3779B97F4A7C15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    ids.push_back(static_cast<int32_t>(3 + z % range));
  }
  return ids;
}

// A key for the ids of one part of one prompt.
uint64_t Key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return seed * 1000003ULL ^ (a + 1) * 0x100000001B3ULL ^ (b + 1) * 0xC2B2AE3D27D4EB4FULL ^
         (c + 1) * 0x165667B19E3779F9ULL;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A greedy request that makes exactly `max_tokens` tokens with K fixed.
v1::GenerateRequest Request(const std::vector<int32_t>& ids, int64_t max_tokens, int32_t k,
                            const std::string& id) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  r.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(max_tokens));
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_speculation()->set_num_speculative_tokens(static_cast<uint32_t>(k));
  r.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
  r.set_request_id(id);
  return r;
}

class Recorder {
 public:
  explicit Recorder(ScenarioArm& arm) : arm_(arm) {}
  // Thread-safe.
  void Add(RequestOutcome o, bool long_prompt = false) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!o.status.ok()) {
      if (arm_.failed++ == 0) arm_.first_error = std::string(o.status.message());
      return;
    }
    (long_prompt ? arm_.long_prompts : arm_.measured).push_back(std::move(o));
  }

 private:
  std::mutex mu_;
  ScenarioArm& arm_;
};

void RunSharedPrefix(v1::Generation::StubInterface& stub, const ScenarioOptions& o, int64_t repeat,
                     ScenarioArm& arm) {
  Recorder rec(arm);
  const Clock::time_point start = Clock::now();
  const std::vector<int32_t> prefix = Ids(Key(o.seed, 0), o.prefix_tokens, o.vocab_size);
  const uint64_t r = static_cast<uint64_t>(repeat);
  // Caches the prefix (on the server that caches); its own suffix is never asked for again.
  const std::vector<int32_t> warm =
      Concat(prefix, Ids(Key(o.seed, 1, r), o.suffix_tokens, o.vocab_size));
  const RequestOutcome w =
      RunRequest(stub, Request(warm, o.max_tokens, o.k, "warm-up"), -1, o.timeout_seconds, start);
  if (!w.status.ok()) rec.Add(w);
  for (int64_t i = 0; i < o.requests; ++i) {
    const std::vector<int32_t> prompt = Concat(
        prefix, Ids(Key(o.seed, 2, r, static_cast<uint64_t>(i)), o.suffix_tokens, o.vocab_size));
    rec.Add(RunRequest(stub, Request(prompt, o.max_tokens, o.k, absl::StrCat("suffix-", i)), i,
                       o.timeout_seconds, start));
  }
}

void RunBurst(v1::Generation::StubInterface& stub, const ScenarioOptions& o, int64_t repeat,
              ScenarioArm& arm) {
  Recorder rec(arm);
  const Clock::time_point start = Clock::now();
  const uint64_t r = static_cast<uint64_t>(repeat);
  // A new prefix every repeat: no cache on either server has it when the burst arrives.
  const std::vector<int32_t> prefix = Ids(Key(o.seed, 6, r), o.prefix_tokens, o.vocab_size);
  std::atomic<int64_t> output_tokens{0};
  std::vector<std::thread> requests;
  for (int64_t i = 0; i < o.requests; ++i) {
    requests.emplace_back([&, i] {
      const std::vector<int32_t> prompt = Concat(
          prefix, Ids(Key(o.seed, 7, r, static_cast<uint64_t>(i)), o.suffix_tokens, o.vocab_size));
      RequestOutcome out =
          RunRequest(stub, Request(prompt, o.max_tokens, o.k, absl::StrCat("burst-", i)), i,
                     o.timeout_seconds, start);
      output_tokens += out.output_tokens;
      rec.Add(std::move(out));
    });
  }
  for (std::thread& t : requests) t.join();
  arm.repeat_wall_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  arm.repeat_output_tokens.push_back(output_tokens.load());
}

void RunChat(v1::Generation::StubInterface& stub, const ScenarioOptions& o, int64_t repeat,
             ScenarioArm& arm) {
  Recorder rec(arm);
  const Clock::time_point start = Clock::now();
  const std::vector<int32_t> system = Ids(Key(o.seed, 0), o.system_tokens, o.vocab_size);
  const uint64_t r = static_cast<uint64_t>(repeat);
  std::atomic<int64_t> output_tokens{0};
  std::vector<std::thread> conversations;
  for (int64_t c = 0; c < o.conversations; ++c) {
    conversations.emplace_back([&, c] {
      std::vector<int32_t> history = system;
      for (int64_t t = 0; t < o.turns; ++t) {
        const std::vector<int32_t> user =
            Ids(Key(o.seed, 3 + r, static_cast<uint64_t>(c), static_cast<uint64_t>(t)),
                o.user_tokens, o.vocab_size);
        history.insert(history.end(), user.begin(), user.end());
        RequestOutcome out = RunRequest(
            stub, Request(history, o.max_tokens, o.k, absl::StrCat("chat-", c, "-turn-", t)),
            c * o.turns + t, o.timeout_seconds, start);
        const bool ok = out.status.ok();
        // The reply joins the history that the next turn resends.
        history.insert(history.end(), out.token_ids.begin(), out.token_ids.end());
        output_tokens += out.output_tokens;
        rec.Add(std::move(out));
        if (!ok) return;
      }
    });
  }
  for (std::thread& t : conversations) t.join();
  arm.repeat_wall_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  arm.repeat_output_tokens.push_back(output_tokens.load());
}

void RunLongPrompts(v1::Generation::StubInterface& stub, const ScenarioOptions& o, int64_t repeat,
                    ScenarioArm& arm) {
  Recorder rec(arm);
  const Clock::time_point start = Clock::now();
  const uint64_t r = static_cast<uint64_t>(repeat);
  std::atomic<int64_t> running{o.streams};
  std::atomic<int64_t> started{0};  // streams that have their first tokens
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < o.streams; ++s) {
    threads.emplace_back([&, s] {
      const std::vector<int32_t> prompt =
          Ids(Key(o.seed, 4, r, static_cast<uint64_t>(s)), 16, o.vocab_size);
      rec.Add(RunRequest(stub, Request(prompt, o.stream_tokens, o.k, absl::StrCat("stream-", s)), s,
                         o.timeout_seconds, start, [&] { ++started; }));
      --running;
    });
  }
  // Long prompts, from when every stream decodes for as long as they do: each sender sends one
  // after another. Each is new text, so no prefix cache can shorten its prefill.
  for (int64_t sender = 0; sender < o.long_prompt_concurrency; ++sender) {
    threads.emplace_back([&, sender] {
      const auto gap = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(o.long_prompt_gap_s));
      while (started.load() < o.streams && running.load() > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      for (int64_t n = 0; running.load() > 0; ++n) {
        if (n > 0) std::this_thread::sleep_for(gap);
        if (running.load() == 0) break;
        const int64_t i = n * o.long_prompt_concurrency + sender;
        const std::vector<int32_t> prompt =
            Ids(Key(o.seed, 5, r, static_cast<uint64_t>(i)), o.long_prompt_tokens, o.vocab_size);
        rec.Add(RunRequest(stub, Request(prompt, o.max_tokens, o.k, absl::StrCat("long-", i)), i,
                           o.timeout_seconds, start),
                /*long_prompt=*/true);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

std::string Fmt(const std::optional<double>& v, int decimals = 1) {
  return v ? absl::StrFormat("%.*f", decimals, *v) : std::string("-");
}

std::optional<double> Ratio(const std::optional<double>& a, const std::optional<double>& b) {
  if (!a || !b || *b == 0) return std::nullopt;
  return *a / *b;
}

nlohmann::ordered_json DistributionJson(const Distribution& d) {
  nlohmann::ordered_json j;
  j["count"] = d.count;
  for (const auto& [name, v] : {std::pair{"mean", d.mean}, std::pair{"p50", d.p50},
                                std::pair{"p90", d.p90}, std::pair{"p99", d.p99}}) {
    j[name] = v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
  }
  return j;
}

// The scenario's headline figures, a over b.
std::vector<std::pair<std::string, std::optional<double>>> Ratios(Scenario scenario,
                                                                  const ScenarioSummary& a,
                                                                  const ScenarioSummary& b) {
  switch (scenario) {
    case Scenario::kSharedPrefix:
      return {{"ttft_mean", Ratio(a.ttft_ms.mean, b.ttft_ms.mean)},
              {"ttft_p50", Ratio(a.ttft_ms.p50, b.ttft_ms.p50)},
              {"ttft_p99", Ratio(a.ttft_ms.p99, b.ttft_ms.p99)}};
    case Scenario::kBurst:
      return {{"ttft_mean", Ratio(a.ttft_ms.mean, b.ttft_ms.mean)},
              {"ttft_p99", Ratio(a.ttft_ms.p99, b.ttft_ms.p99)},
              {"output_tokens_per_s", Ratio(a.output_tokens_per_s, b.output_tokens_per_s)}};
    case Scenario::kChat:
      return {{"output_tokens_per_s", Ratio(a.output_tokens_per_s, b.output_tokens_per_s)},
              {"ttft_p50", Ratio(a.ttft_ms.p50, b.ttft_ms.p50)},
              {"ttft_p99", Ratio(a.ttft_ms.p99, b.ttft_ms.p99)}};
    case Scenario::kLongPrompts:
      return {
          {"itl_p99", Ratio(a.itl_ms.p99, b.itl_ms.p99)},
          {"itl_p50", Ratio(a.itl_ms.p50, b.itl_ms.p50)},
          {"long_prompt_ttft_mean", Ratio(a.long_prompt_ttft_ms.mean, b.long_prompt_ttft_ms.mean)}};
  }
  return {};
}

}  // namespace

absl::StatusOr<Scenario> ParseScenario(const std::string& name) {
  if (name == "shared-prefix") return Scenario::kSharedPrefix;
  if (name == "burst") return Scenario::kBurst;
  if (name == "chat") return Scenario::kChat;
  if (name == "long-prompts") return Scenario::kLongPrompts;
  return absl::InvalidArgumentError(absl::StrCat(
      "--scenario must be shared-prefix, burst, chat or long-prompts, got '", name, "'"));
}

std::string_view ScenarioName(Scenario scenario) {
  switch (scenario) {
    case Scenario::kSharedPrefix:
      return "shared-prefix";
    case Scenario::kBurst:
      return "burst";
    case Scenario::kChat:
      return "chat";
    case Scenario::kLongPrompts:
      return "long-prompts";
  }
  return "unknown";
}

absl::StatusOr<std::vector<ScenarioArm>> RunScenario(v1::Generation::StubInterface& a,
                                                     const std::string& a_address,
                                                     v1::Generation::StubInterface& b,
                                                     const std::string& b_address,
                                                     const ScenarioOptions& options) {
  if (options.vocab_size <= 3) {
    return absl::InvalidArgumentError("the servers' vocabulary is too small for token-id prompts");
  }
  std::vector<ScenarioArm> arms(2);
  arms[0].label = "a";
  arms[0].server = a_address;
  arms[1].label = "b";
  arms[1].server = b_address;
  v1::Generation::StubInterface* stubs[2] = {&a, &b};
  // Unrecorded: the first requests on a fresh server pay for page faults and connection set-up.
  for (size_t i = 0; i < 2; ++i) {
    const RequestOutcome warm = RunRequest(
        *stubs[i],
        Request(Ids(Key(options.seed, 9), 16, options.vocab_size), 8, options.k, "warm-up"), -1,
        options.timeout_seconds, Clock::now());
    if (!warm.status.ok()) {
      return absl::Status(warm.status.code(),
                          absl::StrCat(arms[i].server, " warm-up: ", warm.status.message()));
    }
  }
  for (int64_t r = 0; r < options.repeats; ++r) {
    // a first in even repeats, b first in odd ones.
    for (int i = 0; i < 2; ++i) {
      const size_t which = static_cast<size_t>((r + i) % 2);
      v1::Generation::StubInterface& stub = *stubs[which];
      switch (options.scenario) {
        case Scenario::kSharedPrefix:
          RunSharedPrefix(stub, options, r, arms[which]);
          break;
        case Scenario::kBurst:
          RunBurst(stub, options, r, arms[which]);
          break;
        case Scenario::kChat:
          RunChat(stub, options, r, arms[which]);
          break;
        case Scenario::kLongPrompts:
          RunLongPrompts(stub, options, r, arms[which]);
          break;
      }
    }
  }
  return arms;
}

ScenarioSummary SummarizeScenarioArm(const ScenarioArm& arm) {
  ScenarioSummary s;
  s.label = arm.label;
  s.server = arm.server;
  s.failed = arm.failed;
  s.requests = static_cast<int64_t>(arm.measured.size()) + arm.failed;
  std::vector<double> ttft, itl, long_ttft;
  for (const RequestOutcome& o : arm.measured) {
    s.output_tokens += o.output_tokens;
    if (o.message_s.empty()) continue;
    ttft.push_back(1000 * (o.message_s.front() - o.start_s));
    for (size_t i = 1; i < o.message_s.size(); ++i) {
      itl.push_back(1000 * (o.message_s[i] - o.message_s[i - 1]));
    }
  }
  for (const RequestOutcome& o : arm.long_prompts) {
    if (!o.message_s.empty()) long_ttft.push_back(1000 * (o.message_s.front() - o.start_s));
  }
  s.ttft_ms = Summarize(ttft);
  s.itl_ms = Summarize(itl);
  s.long_prompt_ttft_ms = Summarize(long_ttft);
  for (size_t i = 0; i < arm.repeat_wall_s.size(); ++i) {
    if (arm.repeat_wall_s[i] > 0) {
      s.repeat_output_tokens_per_s.push_back(static_cast<double>(arm.repeat_output_tokens[i]) /
                                             arm.repeat_wall_s[i]);
    }
  }
  s.output_tokens_per_s = Median(s.repeat_output_tokens_per_s);
  return s;
}

std::string FormatScenarioReport(const ScenarioOptions& options,
                                 const std::vector<ScenarioSummary>& arms) {
  std::string out = absl::StrCat("scenario ", std::string(ScenarioName(options.scenario)), ", ",
                                 options.repeats, " repeat(s), K=", options.k, "\n");
  absl::StrAppendFormat(&out, "%-4s %-22s %5s %4s %26s %18s %10s %18s\n", "arm", "server", "reqs",
                        "fail", "TTFT ms mean/p50/p99", "ITL ms p50/p99", "out tok/s",
                        "long TTFT ms mean");
  for (const ScenarioSummary& a : arms) {
    absl::StrAppendFormat(
        &out, "%-4s %-22s %5d %4d %26s %18s %10s %18s\n", a.label, a.server, a.requests, a.failed,
        absl::StrCat(Fmt(a.ttft_ms.mean), "/", Fmt(a.ttft_ms.p50), "/", Fmt(a.ttft_ms.p99)),
        absl::StrCat(Fmt(a.itl_ms.p50), "/", Fmt(a.itl_ms.p99)), Fmt(a.output_tokens_per_s, 2),
        Fmt(a.long_prompt_ttft_ms.mean));
  }
  if (arms.size() == 2) {
    absl::StrAppend(&out, "a / b:");
    for (const auto& [name, v] : Ratios(options.scenario, arms[0], arms[1])) {
      absl::StrAppend(&out, "  ", name, " ", Fmt(v, 3));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

nlohmann::ordered_json ScenarioToJson(const ScenarioOptions& options,
                                      const std::vector<ScenarioSummary>& arms) {
  nlohmann::ordered_json j;
  j["scenario"] = ScenarioName(options.scenario);
  nlohmann::ordered_json c;
  c["k"] = options.k;
  c["repeats"] = options.repeats;
  c["seed"] = options.seed;
  c["max_tokens"] = options.max_tokens;
  switch (options.scenario) {
    case Scenario::kSharedPrefix:
    case Scenario::kBurst:
      c["prefix_tokens"] = options.prefix_tokens;
      c["suffix_tokens"] = options.suffix_tokens;
      c["requests"] = options.requests;
      break;
    case Scenario::kChat:
      c["conversations"] = options.conversations;
      c["turns"] = options.turns;
      c["system_tokens"] = options.system_tokens;
      c["user_tokens"] = options.user_tokens;
      break;
    case Scenario::kLongPrompts:
      c["streams"] = options.streams;
      c["stream_tokens"] = options.stream_tokens;
      c["long_prompt_tokens"] = options.long_prompt_tokens;
      c["long_prompt_gap_s"] = options.long_prompt_gap_s;
      c["long_prompt_concurrency"] = options.long_prompt_concurrency;
      break;
  }
  j["config"] = c;
  j["arms"] = nlohmann::ordered_json::array();
  for (const ScenarioSummary& a : arms) {
    nlohmann::ordered_json arm;
    arm["label"] = a.label;
    arm["server"] = a.server;
    arm["requests"] = a.requests;
    arm["failed"] = a.failed;
    arm["output_tokens"] = a.output_tokens;
    arm["ttft_ms"] = DistributionJson(a.ttft_ms);
    arm["itl_ms"] = DistributionJson(a.itl_ms);
    arm["long_prompt_ttft_ms"] = DistributionJson(a.long_prompt_ttft_ms);
    arm["repeat_output_tokens_per_s"] = a.repeat_output_tokens_per_s;
    arm["output_tokens_per_s"] = a.output_tokens_per_s
                                     ? nlohmann::ordered_json(*a.output_tokens_per_s)
                                     : nlohmann::ordered_json();
    j["arms"].push_back(arm);
  }
  if (arms.size() == 2) {
    nlohmann::ordered_json ratios;
    for (const auto& [name, v] : Ratios(options.scenario, arms[0], arms[1])) {
      ratios[name] = v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
    }
    j["a_over_b"] = ratios;
  }
  return j;
}

}  // namespace specd::bench
