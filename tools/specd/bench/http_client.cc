#include "tools/specd/bench/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd::bench {
nlohmann::json HttpReply::Json() const {
  return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
}

absl::StatusOr<std::unique_ptr<HttpConnection>> HttpConnection::Connect(int port, int timeout_ms) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port, ": ", why));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return std::unique_ptr<HttpConnection>(new HttpConnection(fd, timeout_ms));
}

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status HttpConnection::Send(const std::string& method, const std::string& path,
                                  const std::string& body,
                                  const std::vector<std::string>& headers) {
  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  for (const std::string& h : headers) absl::StrAppend(&request, h, "\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&request, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      // The server may answer (413) and close before it has read everything.
      if (errno == EPIPE || errno == ECONNRESET) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status HttpConnection::Fill() {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, timeout_ms_) <= 0) return absl::DeadlineExceededError("no reply in time");
  char chunk[16384];
  const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
  if (n == 0) return absl::OutOfRangeError("the server closed the connection");
  if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
  buffer_.append(chunk, static_cast<size_t>(n));
  return absl::OkStatus();
}

absl::StatusOr<std::string> HttpConnection::ReadLine() {
  while (true) {
    const size_t eol = buffer_.find("\r\n");
    if (eol != std::string::npos) {
      std::string line = buffer_.substr(0, eol);
      buffer_.erase(0, eol + 2);
      return line;
    }
    if (absl::Status st = Fill(); !st.ok()) return st;
  }
}

absl::Status HttpConnection::ReadExactly(size_t n, std::string* out) {
  while (buffer_.size() < n) {
    if (absl::Status st = Fill(); !st.ok()) return st;
  }
  out->append(buffer_, 0, n);
  buffer_.erase(0, n);
  return absl::OkStatus();
}

absl::StatusOr<HttpReply> HttpConnection::ReadHead() {
  HttpReply reply;
  absl::StatusOr<std::string> status_line = ReadLine();
  if (!status_line.ok()) return status_line.status();
  // Skip "100 Continue".
  while (status_line->rfind("HTTP/1.1 100", 0) == 0) {
    (void)ReadLine();
    status_line = ReadLine();
    if (!status_line.ok()) return status_line.status();
  }
  const size_t sp = status_line->find(' ');
  if (sp == std::string::npos || !absl::SimpleAtoi(status_line->substr(sp + 1, 3), &reply.status)) {
    return absl::InternalError(absl::StrCat("bad status line '", *status_line, "'"));
  }
  while (true) {
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    if (line->empty()) break;
    const size_t colon = line->find(':');
    if (colon == std::string::npos) continue;
    reply.headers[absl::AsciiStrToLower(line->substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line->substr(colon + 1)));
  }
  chunked_ = reply.headers["transfer-encoding"] == "chunked";
  body_done_ = false;
  events_.clear();
  return reply;
}

absl::StatusOr<std::string> HttpConnection::NextChunk() {
  absl::StatusOr<std::string> size_line = ReadLine();
  if (!size_line.ok()) return size_line.status();
  size_t size = 0;
  if (!absl::SimpleHexAtoi(*size_line, &size)) {
    return absl::InternalError(absl::StrCat("bad chunk size '", *size_line, "'"));
  }
  std::string data;
  if (absl::Status st = ReadExactly(size, &data); !st.ok()) return st;
  absl::StatusOr<std::string> end = ReadLine();
  if (!end.ok()) return end.status();
  return data;
}

absl::Status HttpConnection::ReadBody(HttpReply* reply) {
  if (chunked_) {
    while (true) {
      absl::StatusOr<std::string> chunk = NextChunk();
      if (!chunk.ok()) return chunk.status();
      if (chunk->empty()) return absl::OkStatus();
      reply->body += *chunk;
    }
  }
  const auto it = reply->headers.find("content-length");
  size_t length = 0;
  if (it == reply->headers.end() || !absl::SimpleAtoi(it->second, &length)) {
    // Close-delimited.
    while (Fill().ok()) {
    }
    reply->body = std::move(buffer_);
    buffer_.clear();
    return absl::OkStatus();
  }
  return ReadExactly(length, &reply->body);
}

absl::StatusOr<std::optional<std::string>> HttpConnection::NextEvent() {
  while (true) {
    const size_t end = events_.find("\n\n");
    if (end != std::string::npos) {
      std::string event = events_.substr(0, end);
      events_.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) return std::optional<std::string>(event.substr(6));
      continue;
    }
    if (body_done_) return std::optional<std::string>();
    if (chunked_) {
      absl::StatusOr<std::string> chunk = NextChunk();
      if (!chunk.ok()) return chunk.status();
      if (chunk->empty()) body_done_ = true;
      events_ += *chunk;
    } else {
      if (!buffer_.empty()) {
        events_ += buffer_;
        buffer_.clear();
        continue;
      }
      if (!Fill().ok()) body_done_ = true;
    }
  }
}

absl::StatusOr<HttpReply> HttpCall(int port, const std::string& method, const std::string& path,
                                   const std::string& body,
                                   const std::vector<std::string>& headers) {
  absl::StatusOr<std::unique_ptr<HttpConnection>> c = HttpConnection::Connect(port);
  if (!c.ok()) return c.status();
  if (absl::Status st = (*c)->Send(method, path, body, headers); !st.ok()) return st;
  absl::StatusOr<HttpReply> reply = (*c)->ReadHead();
  if (!reply.ok()) return reply.status();
  if (absl::Status st = (*c)->ReadBody(&*reply); !st.ok()) return st;
  return reply;
}

absl::StatusOr<SseReply> HttpStream(int port, const std::string& path, const nlohmann::json& body,
                                    const std::vector<std::string>& headers) {
  absl::StatusOr<std::unique_ptr<HttpConnection>> c = HttpConnection::Connect(port);
  if (!c.ok()) return c.status();
  if (absl::Status st = (*c)->Send("POST", path, body.dump(), headers); !st.ok()) return st;
  absl::StatusOr<HttpReply> head = (*c)->ReadHead();
  if (!head.ok()) return head.status();
  SseReply out;
  out.status = head->status;
  if (head->status != 200) {
    if (absl::Status st = (*c)->ReadBody(&*head); !st.ok()) return st;
    out.body = head->body;
    return out;
  }
  while (true) {
    absl::StatusOr<std::optional<std::string>> event = (*c)->NextEvent();
    if (!event.ok()) return event.status();
    if (!event->has_value()) break;
    if (**event == "[DONE]") {
      out.done = true;
      continue;
    }
    out.events.push_back(nlohmann::json::parse(**event));
  }
  return out;
}

}  // namespace specd::bench
