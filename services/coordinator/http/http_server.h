// The HTTP/1.1 transport of the coordinator's OpenAI-compatible API (issue 15): Boost.Asio for the
// sockets and TLS, Boost.Beast's parser for requests. It knows nothing of OpenAI; it hands each
// request to a handler as an HttpExchange, which the handler answers whole or as a stream from
// any thread (the scheduler's sinks call it), without ever blocking that thread.
//
// Why Asio rather than cpp-httplib (docs/architecture.md, "The HTTP API"): every connection is a
// small object on a few I/O threads, so 128 or 1000 concurrent event streams cost no thread each,
// and a read stays posted on every connection while its response is in progress, so a client
// that closes is noticed at once (the read fails) and its request is cancelled within a round.
#ifndef SPECD_SERVICES_COORDINATOR_HTTP_HTTP_SERVER_H_
#define SPECD_SERVICES_COORDINATOR_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specd::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent
  std::string path;    // target without the query
  // Header names in lower case; a repeated header keeps its last value.
  absl::flat_hash_map<std::string, std::string> headers;
  std::string body;
  int version = 11;  // 10 = HTTP/1.0, 11 = HTTP/1.1

  absl::string_view Header(absl::string_view lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// One request and its response. The methods that answer may be called from any thread, and at
// most one of Respond or StartStream once; after the client went away they do nothing.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  virtual const HttpRequest& request() const = 0;

  // A whole response.
  virtual void Respond(HttpResponse response) = 0;
  // A streamed 200 response (chunked on HTTP/1.1, ended by closing on HTTP/1.0), then Send its
  // pieces in order and End it.
  virtual void StartStream(std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers) = 0;
  virtual void Send(std::string data) = 0;
  virtual void End() = 0;

  // Runs `work` on this exchange's connection (its strand, on an I/O thread), after everything
  // posted before it; dropped once the connection is gone. The scheduler's sinks hand their
  // events over this way, so encoding never runs on the scheduler's thread.
  virtual void Post(std::function<void()> work) = 0;

  // Runs `on_gone` once, on a server thread, if the client goes away (closes or resets its
  // connection) before the response ended; at once if it already has. Never after End or
  // Respond completed the response.
  virtual void OnClientGone(std::function<void()> on_gone) = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct HttpServerOptions {
  std::string listen;    // host:port; port 0 picks a free one
  std::string tls_cert;  // PEM chain and key: serve HTTPS (both or neither)
  std::string tls_key;
  int64_t max_body_bytes = 4 << 20;  // 413 above
  int num_threads = 2;               // I/O threads
  // A connection with no request in progress is closed after this long.
  int64_t idle_timeout_ms = 120'000;
};

class HttpServer {
 public:
  // Binds and starts serving; `handler` is called on an I/O thread for every request and must
  // not block (it hands work on and returns). INVALID_ARGUMENT for a bad address or TLS files,
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop()

  int port() const;
  bool tls() const;
  // Stops accepting, closes every connection (in-progress responses end where they are) and
  // joins the I/O threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specd::http

#endif  // SPECD_SERVICES_COORDINATOR_HTTP_HTTP_SERVER_H_
