#include "tools/specd/bench/http_load.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tools/specd/bench/http_client.h"

namespace specd::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

v1::Usage UsageFromJson(const Json& u) {
  v1::Usage out;
  out.set_prompt_tokens(u.value("prompt_tokens", 0u));
  out.set_completion_tokens(u.value("completion_tokens", 0u));
  if (u.contains("speculative")) {
    const Json& s = u["speculative"];
    out.set_rounds(s.value("rounds", 0u));
    out.set_drafting_rounds(s.value("drafting_rounds", 0u));
    out.set_draft_tokens(s.value("drafted_tokens", 0u));
    out.set_accepted_tokens(s.value("accepted_tokens", 0u));
    out.set_acceptance_rate(s.value("acceptance_rate", 0.0));
    if (s.contains("accepted_per_position")) {
      for (const Json& n : s["accepted_per_position"]) {
        out.add_accepted_per_position(n.get<uint32_t>());
      }
    }
  }
  return out;
}

}  // namespace

Json CompletionBody(const v1::GenerateRequest& r) {
  Json body = {
      {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"return_token_ids", true}};
  if (r.has_token_ids()) {
    body["prompt"] = std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end());
  } else {
    body["prompt"] = r.text();
  }
  const v1::SamplingParameters& s = r.sampling();
  body["temperature"] = s.temperature();
  if (s.top_k() > 0) body["top_k"] = s.top_k();
  if (s.top_p() > 0) body["top_p"] = s.top_p();
  if (s.has_seed()) body["seed"] = s.seed();
  if (r.stopping().max_new_tokens() > 0) body["max_tokens"] = r.stopping().max_new_tokens();
  body["ignore_eos"] = r.stopping().ignore_eos();
  if (r.has_speculation()) {
    body["num_speculative_tokens"] = r.speculation().num_speculative_tokens();
    if (r.speculation().k_policy() == v1::K_POLICY_FIXED) body["k_policy"] = "fixed";
    if (r.speculation().k_policy() == v1::K_POLICY_ADAPTIVE) body["k_policy"] = "adaptive";
    if (r.speculation().draft_method() == v1::DRAFT_METHOD_MODEL) body["draft_method"] = "model";
    if (r.speculation().draft_method() == v1::DRAFT_METHOD_NGRAM) body["draft_method"] = "ngram";
    if (r.speculation().has_tree()) {
      body["speculation_tree"] = {{"branching", r.speculation().tree().branching()},
                                  {"depth", r.speculation().tree().depth()}};
    }
    if (r.speculation().has_egag()) body["egag"] = r.speculation().egag();
  }
  return body;
}

RequestOutcome RunOneHttp(int port, const v1::GenerateRequest& request, int64_t index,
                          double timeout_seconds, Clock::time_point run_start) {
  RequestOutcome out;
  out.index = index;
  out.start_s = SecondsSince(run_start);
  auto fail = [&](const absl::Status& st) {
    out.end_s = SecondsSince(run_start);
    out.status = absl::Status(st.code(), absl::StrCat("request ", index, ": ", st.message()));
    return out;
  };
  absl::StatusOr<std::unique_ptr<HttpConnection>> c =
      HttpConnection::Connect(port, static_cast<int>(timeout_seconds * 1000));
  if (!c.ok()) return fail(c.status());
  if (absl::Status st = (*c)->Send("POST", "/v1/completions", CompletionBody(request).dump());
      !st.ok()) {
    return fail(st);
  }
  absl::StatusOr<HttpReply> head = (*c)->ReadHead();
  if (!head.ok()) return fail(head.status());
  if (head->status != 200) {
    (void)(*c)->ReadBody(&*head);
    return fail(absl::UnavailableError(absl::StrCat("HTTP ", head->status, ": ", head->body)));
  }
  while (true) {
    absl::StatusOr<std::optional<std::string>> event = (*c)->NextEvent();
    if (!event.ok()) return fail(event.status());
    if (!event->has_value() || **event == "[DONE]") break;
    const double now = SecondsSince(run_start);
    const Json chunk = Json::parse(**event, nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded()) return fail(absl::InternalError("an event is not JSON"));
    if (chunk.contains("error")) {
      return fail(absl::UnavailableError(chunk["error"].value("message", "error event")));
    }
    int64_t tokens = 0;
    for (const Json& choice : chunk["choices"]) {
      if (choice.contains("token_ids")) tokens += static_cast<int64_t>(choice["token_ids"].size());
      if (!choice["finish_reason"].is_null()) {
        out.finish_reason = choice["finish_reason"] == "length" ? v1::FINISH_REASON_LENGTH
                                                                : v1::FINISH_REASON_EOS_TOKEN;
      }
    }
    if (tokens > 0) {
      out.message_s.push_back(now);
      out.message_tokens.push_back(static_cast<int32_t>(tokens));
      out.output_tokens += tokens;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      out.has_usage = true;
      out.usage = UsageFromJson(chunk["usage"]);
    }
  }
  out.end_s = SecondsSince(run_start);
  return out;
}

}  // namespace specd::bench
