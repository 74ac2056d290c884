// The client half of `specd generate --server ADDR`: one streamed Generate call.
#ifndef SPECD_TOOLS_SPECD_REMOTE_GENERATE_H_
#define SPECD_TOOLS_SPECD_REMOTE_GENERATE_H_

#include <string>

#include "specd/v1/generation.pb.h"

namespace specd::cli {

// Streams the text to stdout and a summary (acceptance rate, tokens/s) to stderr. Returns the
// process exit code.
int RemoteGenerate(const std::string& server, const v1::GenerateRequest& request,
                   double timeout_seconds);

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_REMOTE_GENERATE_H_
