// The same-host path between the coordinator and a worker: the calls of a round (Draft, Verify,
// Truncate, ReadRows, QueryLogprobs, Release) as frames over a Unix stream socket, each carrying
// the gRPC call's own protobuf message. On one host gRPC's own unary path is most of a round's
// overhead (about 150–200 µs a call against tens for a socket round trip; docs/benchmarks.md),
// and a GPU round of a 3B model lasts only a few milliseconds.
//
// A frame is a 4-byte little-endian length of what follows, a tag byte, then the payload. After
// accepting a connection the worker sends a hello frame (its epoch and protocol version, so the
// client knows it reached the process whose Info it read); then each request frame (tag: the
// Method, payload: the request message) gets one reply frame (tag: the absl::StatusCode, payload:
// the response message, or the error's message). One call at a time per connection.
#ifndef SPECD_SERVICES_COMMON_LOCAL_FRAME_H_
#define SPECD_SERVICES_COMMON_LOCAL_FRAME_H_

#include <sys/un.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace specd::local {

enum class Method : uint8_t {
  kDraft = 1,
  kVerify = 2,
  kTruncate = 3,
  kReadRows = 4,
  kQueryLogprobs = 5,
  kRelease = 6,
};
const char* MethodName(Method m);

inline constexpr uint8_t kHelloTag = 0x68;
// As the coordinator's gRPC channel: a long prompt's Verify is megabytes at most.
inline constexpr uint32_t kMaxFrameBytes = 256u << 20;

// The address of the Unix socket at `path`; INVALID_ARGUMENT for a path that cannot be one
// (empty, or too long for sun_path).
absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path);

struct Frame {
  uint8_t tag = 0;
  std::string payload;
};

// Both fail with DEADLINE_EXCEEDED once `deadline` passes, UNAVAILABLE when the peer has closed
// the socket or it fails. ReadFrame fails with INVALID_ARGUMENT for a frame length of 0 or over
// kMaxFrameBytes; the stream cannot be resynchronised after it, so the caller closes it.
absl::Status WriteFrame(int fd, uint8_t tag, absl::string_view payload, absl::Time deadline);
absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline);

struct Hello {
  uint64_t epoch = 0;
  uint32_t protocol_version = 0;
};
std::string EncodeHello(const Hello& hello);
// INVALID_ARGUMENT unless `frame` is a hello frame.
absl::StatusOr<Hello> DecodeHello(const Frame& frame);

}  // namespace specd::local

#endif  // SPECD_SERVICES_COMMON_LOCAL_FRAME_H_
