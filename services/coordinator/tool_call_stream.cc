#include "services/coordinator/tool_call_stream.h"

#include <tuple>

namespace specd {

std::optional<ParsedReply> ToolCallPolicy::Parse(std::string_view reply) const {
  if (!parses()) return std::nullopt;
  std::optional<ParsedReply> parsed = ParseToolCalls(reply, format, tools);
  if (parsed.has_value() && !parallel_tool_calls) parsed->calls.resize(1);
  return parsed;
}

std::optional<ToolCallStream::Chunk> ToolCallStream::Next(std::string_view reply, size_t tokens,
                                                          bool last) {
  Chunk chunk;
  chunk.begin_token = sent_tokens_;
  if (last) {
    held_.clear();
    chunk.end_token = tokens;
    if (std::optional<ParsedReply> parsed = policy_->Parse(reply); parsed.has_value()) {
      // The content before the calls that is not out yet (nothing past it ever went out).
      if (parsed->content.size() > sent_bytes_) chunk.content = parsed->content.substr(sent_bytes_);
      chunk.calls = std::move(parsed->calls);
    } else {
      chunk.content = std::string(reply.substr(sent_bytes_));
    }
    sent_bytes_ = reply.size();
    sent_tokens_ = tokens;
    return chunk;
  }
  held_.emplace_back(reply.size(), tokens);
  releasable_ = ReleasableContent(reply, policy_->format, releasable_);
  size_t bytes = sent_bytes_;
  size_t end_token = sent_tokens_;
  size_t n = 0;
  while (n < held_.size() && held_[n].first <= releasable_) {
    std::tie(bytes, end_token) = held_[n];
    ++n;
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n));
  if (n == 0) return std::nullopt;
  chunk.content = std::string(reply.substr(sent_bytes_, bytes - sent_bytes_));
  chunk.end_token = end_token;
  sent_bytes_ = bytes;
  sent_tokens_ = end_token;
  return chunk;
}

}  // namespace specd
