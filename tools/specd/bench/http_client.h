// A small blocking HTTP/1.1 client over plain TCP to 127.0.0.1 for the OpenAI-compatible API:
// whole requests, server-sent event streams read event by event (as they arrive, for `specd
// bench --http`'s latencies), and connections a caller can drop mid-stream (the HTTP API's tests
// use that; no library client makes it easy). Real clients (the openai npm package, curl,
// Python's urllib) are exercised by the tests' own scripts.
#ifndef SPECD_TOOLS_SPECD_BENCH_HTTP_CLIENT_H_
#define SPECD_TOOLS_SPECD_BENCH_HTTP_CLIENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace specd::bench {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  nlohmann::json Json() const;  // the body parsed (null when it is not JSON)
};

// One connection.
class HttpConnection {
 public:
  // A connection to 127.0.0.1:`port`; `timeout_ms` bounds every read.
  static absl::StatusOr<std::unique_ptr<HttpConnection>> Connect(int port,
                                                                 int timeout_ms = 120'000);
  ~HttpConnection();

  // Sends a request. `headers` are extra "Name: value" lines.
  absl::Status Send(const std::string& method, const std::string& path, const std::string& body,
                    const std::vector<std::string>& headers = {});
  // Reads the status line and headers of the reply.
  absl::StatusOr<HttpReply> ReadHead();
  // Reads the whole body of a reply whose head was read (Content-Length or chunked).
  absl::Status ReadBody(HttpReply* reply);
  // For event streams: the next "data: ..." payload, or nullopt at the end of the stream.
  absl::StatusOr<std::optional<std::string>> NextEvent();
  // Closes the socket abruptly (as a client that goes away does).
  void Close();

 private:
  HttpConnection(int fd, int timeout_ms) : fd_(fd), timeout_ms_(timeout_ms) {}
  absl::StatusOr<std::string> ReadLine();
  absl::Status ReadExactly(size_t n, std::string* out);
  absl::Status Fill();
  // Body bytes of a chunked reply, one chunk at a time ("" at the end).
  absl::StatusOr<std::string> NextChunk();

  int fd_;
  int timeout_ms_;
  std::string buffer_;
  bool chunked_ = false;
  std::string events_;  // body bytes not yet split into events
  bool body_done_ = false;
};

// One request on a new connection: the whole reply.
absl::StatusOr<HttpReply> HttpCall(int port, const std::string& method, const std::string& path,
                                   const std::string& body = "",
                                   const std::vector<std::string>& headers = {});

// A streamed request: every event's JSON payload, until [DONE].
struct SseReply {
  int status = 0;
  std::vector<nlohmann::json> events;
  bool done = false;  // [DONE] was received
  std::string body;   // for a non-200 reply
};
absl::StatusOr<SseReply> HttpStream(int port, const std::string& path, const nlohmann::json& body,
                                    const std::vector<std::string>& headers = {});

}  // namespace specd::bench

#endif  // SPECD_TOOLS_SPECD_BENCH_HTTP_CLIENT_H_
