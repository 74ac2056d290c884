// A chat reply to a request with tools, as both APIs stream it: the model writes its calls as
// text (tool_calls.h), which must never reach the client as content, nor a call as half of one.
// So the reply goes out in whole events (the tokens and logprobs of an event stay with its
// text) up to where a call may begin; what follows waits for text that shows it is content, or
// for the end of the reply, where it is parsed.
#ifndef SPECD_SERVICES_COORDINATOR_TOOL_CALL_STREAM_H_
#define SPECD_SERVICES_COORDINATOR_TOOL_CALL_STREAM_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "services/coordinator/tool_calls.h"

namespace specd {

// What a request asks of its replies' tool calls.
struct ToolCallPolicy {
  ToolCallFormat format = ToolCallFormat::kLlama3Json;
  // The tools a reply may call; empty when replies are content, never parsed (no tools, or
  // tool_choice "none").
  absl::flat_hash_set<std::string> tools;
  bool parallel_tool_calls = true;  // false: only a reply's first call

  bool parses() const { return !tools.empty(); }
  // The calls a whole reply makes; nullopt when it is content.
  std::optional<ParsedReply> Parse(std::string_view reply) const;
};

class ToolCallStream {
 public:
  // `policy` must outlive the stream.
  explicit ToolCallStream(const ToolCallPolicy& policy) : policy_(&policy) {}

  // What may go out after an event.
  struct Chunk {
    std::string content;  // the reply's text to send (may be empty at the end)
    // The reply's tokens that go with it: [begin_token, end_token).
    size_t begin_token = 0;
    size_t end_token = 0;
    // At the end of a reply that is calls: them (`content` is then what is left of the text
    // before them). nullopt otherwise.
    std::optional<std::vector<ToolCall>> calls;
  };

  // After each event: `reply` and `tokens` are the whole reply so far (its text, its number of
  // tokens), and `last` says the event ended it. nullopt while everything new is held; a `last`
  // event always gives the rest.
  std::optional<Chunk> Next(std::string_view reply, size_t tokens, bool last);

 private:
  const ToolCallPolicy* policy_;
  size_t sent_bytes_ = 0;   // of the reply's text
  size_t sent_tokens_ = 0;  // of its tokens
  size_t releasable_ = 0;   // ReleasableContent of the reply so far
  // The ends (bytes, tokens) of the events not sent yet, oldest first.
  std::vector<std::pair<size_t, size_t>> held_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_TOOL_CALL_STREAM_H_
