#include "services/common/local_frame.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace specd::local {
namespace {

constexpr size_t kHeaderBytes = 5;  // length, tag
constexpr size_t kHelloBytes = 12;  // epoch, protocol version

// Waits until `fd` is ready for `events`: OK, or DEADLINE_EXCEEDED / UNAVAILABLE.
absl::Status Wait(int fd, short events, absl::Time deadline) {
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("deadline passed");
      timeout_ms = static_cast<int>(
          std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, int64_t{1} << 30));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n > 0) return absl::OkStatus();  // readable, writable, or an error the call will report
    if (n == 0) continue;                // the loop checks the deadline
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("poll: ", strerror(errno)));
  }
}

absl::Status ReadExactly(int fd, char* out, size_t size, absl::Time deadline) {
  size_t done = 0;
  while (done < size) {
    if (absl::Status st = Wait(fd, POLLIN, deadline); !st.ok()) return st;
    const ssize_t n = recv(fd, out + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      return absl::UnavailableError("the peer closed the connection");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const char* data, size_t size, absl::Time deadline) {
  size_t done = 0;
  while (done < size) {
    // MSG_NOSIGNAL: a closed peer is an error here, not a SIGPIPE for the whole process.
    const ssize_t n = send(fd, data + done, size - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status st = Wait(fd, POLLOUT, deadline); !st.ok()) return st;
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

}  // namespace

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a path of 1 to ", sizeof(addr.sun_path) - 1, " bytes, got ", path.size()));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

const char* MethodName(Method m) {
  switch (m) {
    case Method::kDraft:
      return "Draft";
    case Method::kVerify:
      return "Verify";
    case Method::kTruncate:
      return "Truncate";
    case Method::kReadRows:
      return "ReadRows";
    case Method::kQueryLogprobs:
      return "QueryLogprobs";
    case Method::kRelease:
      return "Release";
  }
  return "an unknown method";
}

absl::Status WriteFrame(int fd, uint8_t tag, absl::string_view payload, absl::Time deadline) {
  if (payload.size() >= kMaxFrameBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a frame of ", payload.size() + 1, " bytes is over the limit of ", kMaxFrameBytes));
  }
  // Small frames (most of a round's) go out in one send.
  std::string frame(kHeaderBytes, '\0');
  PutU32(static_cast<uint32_t>(payload.size() + 1), frame.data());
  frame[4] = static_cast<char>(tag);
  if (payload.size() <= 64 * 1024) {
    frame.append(payload.data(), payload.size());
    return WriteAll(fd, frame.data(), frame.size(), deadline);
  }
  if (absl::Status st = WriteAll(fd, frame.data(), frame.size(), deadline); !st.ok()) return st;
  return WriteAll(fd, payload.data(), payload.size(), deadline);
}

absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline) {
  char header[kHeaderBytes];
  if (absl::Status st = ReadExactly(fd, header, kHeaderBytes, deadline); !st.ok()) return st;
  const uint32_t length = GetU32(header);
  if (length == 0 || length > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame length of ", length, " bytes (allowed: 1 to ", kMaxFrameBytes, ")"));
  }
  Frame frame;
  frame.tag = static_cast<uint8_t>(header[4]);
  frame.payload.resize(length - 1);
  if (absl::Status st = ReadExactly(fd, frame.payload.data(), length - 1, deadline); !st.ok()) {
    return st;
  }
  return frame;
}

std::string EncodeHello(const Hello& hello) {
  std::string out(kHelloBytes, '\0');
  PutU32(static_cast<uint32_t>(hello.epoch & 0xffffffffu), out.data());
  PutU32(static_cast<uint32_t>(hello.epoch >> 32), out.data() + 4);
  PutU32(hello.protocol_version, out.data() + 8);
  return out;
}

absl::StatusOr<Hello> DecodeHello(const Frame& frame) {
  if (frame.tag != kHelloTag || frame.payload.size() != kHelloBytes) {
    return absl::InvalidArgumentError("the first frame is not a worker's hello");
  }
  Hello h;
  h.epoch =
      uint64_t{GetU32(frame.payload.data())} | (uint64_t{GetU32(frame.payload.data() + 4)} << 32);
  h.protocol_version = GetU32(frame.payload.data() + 8);
  return h;
}

}  // namespace specd::local
