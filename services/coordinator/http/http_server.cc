#include "services/coordinator/http/http_server.h"

#include <algorithm>
#include <array>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "boost/asio.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/beast/http.hpp"

namespace specd::http {
namespace {

namespace asio = boost::asio;
namespace beast_http = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

constexpr size_t kReadChunk = 16 * 1024;
constexpr uint32_t kHeaderLimit = 64 * 1024;
// How long a connection closed after an error response still reads (and drops) what the client
// sends, so that it sees the response rather than a reset.
constexpr auto kLinger = std::chrono::seconds(2);

std::string StatusLine(int status, int version) {
  const auto reason = beast_http::obsolete_reason(static_cast<beast_http::status>(status));
  return absl::StrCat(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ", status, " ",
                      absl::string_view(reason.data(), reason.size()), "\r\n");
}

std::string ErrorBody(absl::string_view message, absl::string_view type) {
  // The OpenAI error shape; built by hand since this layer knows no JSON library.
  std::string escaped;
  for (const char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    escaped += c;
  }
  return absl::StrCat(R"({"error":{"message":")", escaped, R"(","type":")", type,
                      R"(","param":null,"code":null}})");
}

// The socket, plain or TLS, behind one interface for the session.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual void Handshake(std::function<void(error_code)> done) = 0;
  virtual void ReadSome(asio::mutable_buffer buffer,
                        std::function<void(error_code, size_t)> done) = 0;
  virtual void Write(asio::const_buffer buffer, std::function<void(error_code, size_t)> done) = 0;
  virtual tcp::socket& socket() = 0;
};

class PlainTransport final : public Transport {
 public:
  explicit PlainTransport(tcp::socket socket) : socket_(std::move(socket)) {}
  void Handshake(std::function<void(error_code)> done) override { done(error_code()); }
  void ReadSome(asio::mutable_buffer buffer,
                std::function<void(error_code, size_t)> done) override {
    socket_.async_read_some(buffer, std::move(done));
  }
  void Write(asio::const_buffer buffer, std::function<void(error_code, size_t)> done) override {
    asio::async_write(socket_, buffer, std::move(done));
  }
  tcp::socket& socket() override { return socket_; }

 private:
  tcp::socket socket_;
};

class TlsTransport final : public Transport {
 public:
  TlsTransport(tcp::socket socket, asio::ssl::context& context)
      : stream_(std::move(socket), context) {}
  void Handshake(std::function<void(error_code)> done) override {
    stream_.async_handshake(asio::ssl::stream_base::server, std::move(done));
  }
  void ReadSome(asio::mutable_buffer buffer,
                std::function<void(error_code, size_t)> done) override {
    stream_.async_read_some(buffer, std::move(done));
  }
  void Write(asio::const_buffer buffer, std::function<void(error_code, size_t)> done) override {
    asio::async_write(stream_, buffer, std::move(done));
  }
  tcp::socket& socket() override { return stream_.next_layer(); }

 private:
  asio::ssl::stream<tcp::socket> stream_;
};

class Session;

// The exchange of the request a session is answering. Its answering methods post to the
// session's strand; once the session is gone they do nothing.
class Exchange final : public HttpExchange, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::weak_ptr<Session> session, asio::strand<asio::io_context::executor_type> strand,
           HttpRequest request)
      : session_(std::move(session)), strand_(std::move(strand)), request_(std::move(request)) {}

  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse response) override;
  void StartStream(std::string content_type,
                   std::vector<std::pair<std::string, std::string>> headers) override;
  void Send(std::string data) override;
  void End() override;
  void Post(std::function<void()> work) override;
  void OnClientGone(std::function<void()> on_gone) override;

  // On the strand: the client went away while this exchange was open.
  void MarkGone();

 private:
  template <typename F>
  void OnStrand(F f);

  std::weak_ptr<Session> session_;
  asio::strand<asio::io_context::executor_type> strand_;
  const HttpRequest request_;
  // Strand only.
  bool gone_ = false;
  std::function<void()> on_gone_;
};

class Session final : public std::enable_shared_from_this<Session> {
 public:
  Session(std::unique_ptr<Transport> transport,
          asio::strand<asio::io_context::executor_type> strand, const HttpServerOptions& options,
          const HttpHandler& handler)
      : transport_(std::move(transport)),
        strand_(std::move(strand)),
        options_(options),
        handler_(handler),
        idle_timer_(strand_) {}

  void Start() {
    ArmIdleTimer();
    transport_->Handshake(asio::bind_executor(strand_, [self = shared_from_this()](error_code ec) {
      if (ec) {
        self->Close();
        return;
      }
      self->ResetParser();
      self->DoRead();
    }));
  }

  const asio::strand<asio::io_context::executor_type>& strand() const { return strand_; }

  // Strand only, all below.
  bool IsCurrent(const Exchange* e) const { return !closed_ && exchange_.get() == e; }

  void Close() {
    if (closed_) return;
    closed_ = true;
    idle_timer_.cancel();
    error_code ignored;
    transport_->socket().shutdown(tcp::socket::shutdown_both, ignored);
    transport_->socket().close(ignored);
  }

  // Appends bytes of the current response; `last` ends it.
  void Queue(std::string data, bool last) {
    if (closed_) return;
    if (!data.empty()) out_.push_back(std::move(data));
    if (last) {
      out_.push_back(std::string());  // the marker: the response is complete after the bytes before
      exchange_.reset();
    }
    DoWrite();
  }

  void RespondWhole(const HttpResponse& r) {
    std::string head = StatusLine(r.status, version_);
    absl::StrAppend(&head, "Content-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
                    "\r\n");
    for (const auto& [name, value] : r.headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
    if (!keep_alive_) absl::StrAppend(&head, "Connection: close\r\n");
    absl::StrAppend(&head, "\r\n", r.body);
    Queue(std::move(head), /*last=*/true);
  }

  void StartStream(const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) {
    // HTTP/1.0 has no chunked encoding: the stream ends when the connection closes.
    chunked_ = version_ != 10;
    if (!chunked_) keep_alive_ = false;
    std::string head = StatusLine(200, version_);
    absl::StrAppend(&head, "Content-Type: ", content_type, "\r\nCache-Control: no-cache\r\n");
    for (const auto& [name, value] : headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
    absl::StrAppend(&head, chunked_ ? "Transfer-Encoding: chunked\r\n" : "Connection: close\r\n",
                    "\r\n");
    Queue(std::move(head), false);
  }

  void SendChunk(std::string data) {
    if (data.empty()) return;  // an empty chunk would end the stream
    if (chunked_) {
      std::string framed = absl::StrCat(absl::Hex(data.size()), "\r\n");
      framed += data;
      framed += "\r\n";
      Queue(std::move(framed), false);
    } else {
      Queue(std::move(data), false);
    }
  }

  void EndStream() { Queue(chunked_ ? std::string("0\r\n\r\n") : std::string(), true); }

 private:
  void ResetParser() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(static_cast<uint64_t>(options_.max_body_bytes));
    parser_->eager(true);
    sent_continue_ = false;
  }

  void ArmIdleTimer() {
    idle_timer_.expires_after(std::chrono::milliseconds(options_.idle_timeout_ms));
    idle_timer_.async_wait([self = shared_from_this()](error_code ec) {
      // Cancelled (a request started, or the session closed), or re-armed since.
      if (ec || self->busy_ || self->closed_) return;
      if (self->idle_timer_.expiry() > asio::steady_timer::clock_type::now()) return;
      self->Close();
    });
  }

  void DoRead() {
    if (reading_ || closed_) return;
    // A client that pipelines a flood while a response is in progress waits (TCP backpressure).
    if (buffered_.size() > static_cast<size_t>(options_.max_body_bytes) + kHeaderLimit) return;
    reading_ = true;
    // Into a buffer of its own: buffered_ changes (Parse consumes it) while the read is pending.
    transport_->ReadSome(
        asio::buffer(read_buffer_),
        asio::bind_executor(strand_, [self = shared_from_this()](error_code ec, size_t n) {
          self->reading_ = false;
          if (!ec) self->buffered_.append(self->read_buffer_.data(), n);
          self->OnRead(ec);
        }));
  }

  void OnRead(error_code ec) {
    if (ec) {
      // EOF, a reset or our own close: a response in progress has lost its client.
      if (exchange_ != nullptr) {
        std::shared_ptr<Exchange> gone = std::move(exchange_);
        gone->MarkGone();
      }
      Close();
      return;
    }
    if (lingering_) {
      buffered_.clear();
      DoRead();
      return;
    }
    if (!busy_) Parse();
    DoRead();
  }

  // Feeds the buffered bytes to the parser; starts an exchange when a request is complete.
  void Parse() {
    while (!busy_ && !closed_ && !lingering_ && !buffered_.empty()) {
      error_code ec;
      const size_t used = parser_->put(asio::buffer(buffered_), ec);
      buffered_.erase(0, used);
      if (ec == beast_http::error::need_more) {
        MaybeSendContinue();
        return;
      }
      if (ec) {
        FailRequest(ec);
        return;
      }
      if (parser_->is_done()) {
        Dispatch();
        return;
      }
      if (used == 0) return;
    }
  }

  void MaybeSendContinue() {
    if (sent_continue_ || !parser_->is_header_done()) return;
    const auto expect = parser_->get()[beast_http::field::expect];
    if (!absl::EqualsIgnoreCase(absl::string_view(expect.data(), expect.size()), "100-continue")) {
      return;
    }
    sent_continue_ = true;
    out_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
    DoWrite();
  }

  void FailRequest(error_code ec) {
    const bool too_big = ec == beast_http::error::body_limit;
    HttpResponse r;
    r.status = too_big ? 413 : ec == beast_http::error::header_limit ? 431 : 400;
    r.body =
        ErrorBody(too_big ? absl::StrCat("the request body is over the server's limit of ",
                                         options_.max_body_bytes, " bytes (--max-request-bytes)")
                          : absl::StrCat("malformed HTTP request: ", ec.message()),
                  "invalid_request_error");
    // The rest of the connection's bytes cannot be framed any more: answer, then close.
    version_ = 11;
    keep_alive_ = false;
    busy_ = true;
    exchange_ = std::make_shared<Exchange>(weak_from_this(), strand_, HttpRequest());
    RespondWhole(r);
  }

  void Dispatch() {
    beast_http::request<beast_http::string_body> msg = parser_->release();
    ResetParser();
    HttpRequest request;
    request.method = std::string(msg.method_string());
    request.target = std::string(msg.target());
    request.path = request.target.substr(0, request.target.find('?'));
    for (const auto& field : msg) {
      request.headers[absl::AsciiStrToLower(absl::string_view(
          field.name_string().data(), field.name_string().size()))] = std::string(field.value());
    }
    request.body = std::move(msg.body());
    request.version = msg.version();
    version_ = msg.version();
    keep_alive_ = msg.keep_alive();
    busy_ = true;
    idle_timer_.cancel();
    exchange_ = std::make_shared<Exchange>(weak_from_this(), strand_, std::move(request));
    handler_(exchange_);
  }

  void DoWrite() {
    if (writing_ || closed_) return;
    while (!out_.empty() && out_.front().empty()) {
      // A response ended here.
      out_.pop_front();
      if (!keep_alive_) {
        EndConnection();
        return;
      }
      busy_ = false;
      ArmIdleTimer();
      Parse();  // a pipelined request may be waiting
      DoRead();
    }
    if (out_.empty()) return;
    writing_ = true;
    transport_->Write(
        asio::buffer(out_.front()),
        asio::bind_executor(strand_, [self = shared_from_this()](error_code ec, size_t) {
          self->writing_ = false;
          if (ec) {
            self->OnRead(ec);  // the client is gone: same as a failed read
            self->Close();
            return;
          }
          self->out_.pop_front();
          self->DoWrite();
        }));
  }

  // After the last response of a connection: stop sending, and read until the client closes
  // (or a short linger passes), so that it reads the response rather than a reset.
  void EndConnection() {
    lingering_ = true;
    error_code ignored;
    transport_->socket().shutdown(tcp::socket::shutdown_send, ignored);
    idle_timer_.expires_after(kLinger);
    idle_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->Close();
    });
    buffered_.clear();
    DoRead();
  }

  std::unique_ptr<Transport> transport_;
  asio::strand<asio::io_context::executor_type> strand_;
  const HttpServerOptions& options_;
  const HttpHandler& handler_;
  asio::steady_timer idle_timer_;
  std::optional<beast_http::request_parser<beast_http::string_body>> parser_;
  std::array<char, kReadChunk> read_buffer_;
  std::string buffered_;                // received, not yet parsed
  std::deque<std::string> out_;         // an empty string ends a response
  std::shared_ptr<Exchange> exchange_;  // the request being answered
  bool busy_ = false;                   // a request is being answered
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool lingering_ = false;
  bool sent_continue_ = false;
  bool keep_alive_ = true;
  bool chunked_ = false;
  int version_ = 11;
};

template <typename F>
void Exchange::OnStrand(F f) {
  std::shared_ptr<Session> session = session_.lock();
  if (session == nullptr) return;
  asio::post(strand_,
             [session = std::move(session), self = shared_from_this(), f = std::move(f)]() mutable {
               // A late call of an exchange that is over (or whose client left) must not reach the
               // next request's response on the same connection.
               if (session->IsCurrent(self.get())) f(*session);
             });
}

void Exchange::Respond(HttpResponse response) {
  OnStrand([response = std::move(response)](Session& s) { s.RespondWhole(response); });
}

void Exchange::StartStream(std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers) {
  OnStrand([content_type = std::move(content_type), headers = std::move(headers)](Session& s) {
    s.StartStream(content_type, headers);
  });
}

void Exchange::Send(std::string data) {
  OnStrand([data = std::move(data)](Session& s) mutable { s.SendChunk(std::move(data)); });
}

void Exchange::End() {
  OnStrand([](Session& s) { s.EndStream(); });
}

void Exchange::Post(std::function<void()> work) {
  if (session_.expired()) return;
  asio::post(strand_, std::move(work));
}

void Exchange::OnClientGone(std::function<void()> on_gone) {
  asio::post(strand_, [self = shared_from_this(), on_gone = std::move(on_gone)]() mutable {
    if (self->gone_) {
      on_gone();
    } else {
      self->on_gone_ = std::move(on_gone);
    }
  });
}

void Exchange::MarkGone() {
  gone_ = true;
  if (on_gone_) std::exchange(on_gone_, nullptr)();
}

}  // namespace

absl::string_view HttpRequest::Header(absl::string_view lower_name) const {
  const auto it = headers.find(lower_name);
  return it == headers.end() ? absl::string_view() : absl::string_view(it->second);
}

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler)
      : options_(options),
        handler_(std::move(handler)),
        ssl_(asio::ssl::context::tls_server),
        io_(std::max(1, options.num_threads)),
        acceptor_(asio::make_strand(io_)) {}
  ~Impl() { Stop(); }

  absl::Status Listen() {
    const size_t colon = options_.listen.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(options_.listen.substr(colon + 1), &port) ||
        port < 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-listen: '", options_.listen, "' is not HOST:PORT"));
    }
    std::string host = options_.listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (host == "localhost") host = "127.0.0.1";
    error_code ec;
    const asio::ip::address address = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-listen: '", host, "' is not an IP address (", ec.message(), ")"));
    }
    if (!options_.tls_cert.empty()) {
      ssl_.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
      ssl_.use_certificate_chain_file(options_.tls_cert, ec);
      if (!ec) ssl_.use_private_key_file(options_.tls_key, asio::ssl::context::pem, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tls-cert/--tls-key: not a PEM certificate chain and its private key (",
                         ec.message(), ")"));
      }
      tls_ = true;
    }
    const tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("--http-listen: cannot listen on ", options_.listen, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    DoAccept();
    for (int i = 0; i < std::max(1, options_.num_threads); ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
    return absl::OkStatus();
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    asio::post(acceptor_.get_executor(), [this] {
      error_code ignored;
      acceptor_.close(ignored);
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::weak_ptr<Session>& w : sessions_) {
        if (std::shared_ptr<Session> s = w.lock()) {
          asio::post(s->strand(), [s] { s->Close(); });
        }
      }
    }
    // Every operation now fails and the threads run out of work; a straggler (a connection
    // lingering after its last response) gets a few seconds.
    for (int i = 0; i < 300 && !io_.stopped(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    io_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  int port() const { return port_; }
  bool tls() const { return tls_; }

 private:
  void DoAccept() {
    // Each connection's handlers run on its own strand, and its socket's operations too.
    const asio::strand<asio::io_context::executor_type> strand = asio::make_strand(io_);
    acceptor_.async_accept(strand, [this, strand](error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);  // small SSE events go out at once
        std::unique_ptr<Transport> transport;
        if (tls_) {
          transport = std::make_unique<TlsTransport>(std::move(socket), ssl_);
        } else {
          transport = std::make_unique<PlainTransport>(std::move(socket));
        }
        auto session = std::make_shared<Session>(std::move(transport), strand, options_, handler_);
        {
          std::lock_guard<std::mutex> lock(mu_);
          sessions_.erase(
              std::remove_if(sessions_.begin(), sessions_.end(),
                             [](const std::weak_ptr<Session>& w) { return w.expired(); }),
              sessions_.end());
          sessions_.push_back(session);
        }
        asio::post(strand, [session] { session->Start(); });
      }
      DoAccept();
    });
  }

  const HttpServerOptions options_;
  const HttpHandler handler_;
  // Before io_, which is destroyed first with the sessions its handlers still hold.
  asio::ssl::context ssl_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  bool tls_ = false;
  int port_ = 0;
  bool stopped_ = false;
  std::mutex mu_;
  std::vector<std::weak_ptr<Session>> sessions_;  // guarded by mu_
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }
int HttpServer::port() const { return impl_->port(); }
bool HttpServer::tls() const { return impl_->tls(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace specd::http
