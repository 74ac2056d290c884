#include "tests/services/serve_process.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd::testing {

std::unique_ptr<ServeProcess> ServeProcess::Start(const std::vector<std::string>& args,
                                                  const std::filesystem::path& pid_dir) {
  auto s = std::unique_ptr<ServeProcess>(new ServeProcess());
  s->pid_dir_ = pid_dir;
  std::vector<std::string> argv = {"serve", "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!pid_dir.empty()) argv.insert(argv.end(), {"--pid-dir", pid_dir.string()});
  auto serve = ChildProcess::Start(BuiltBinary("tools/specd"), argv);
  EXPECT_TRUE(serve.ok()) << serve.status();
  if (!serve.ok()) return nullptr;
  s->process_ = *std::move(serve);
  s->Reconnect();
  return s;
}

ServeProcess::~ServeProcess() {
  // The client goes first: an open connection would hold up the coordinator's drain.
  stub_.reset();
  // SIGTERM, not the child's SIGKILL: `specd serve` then stops its three children.
  if (process_ != nullptr) {
    EXPECT_EQ(process_->Terminate(), 0) << process_->StderrText();
  }
}

void ServeProcess::Reconnect() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // not the old connection's backoff
  stub_ = v1::Generation::NewStub(
      grpc::CreateCustomChannel(process_->address(), grpc::InsecureChannelCredentials(), args));
}

pid_t ServeProcess::Pid(const std::string& child) const {
  std::ifstream in(pid_dir_ / (child + ".pid"));
  pid_t pid = -1;
  in >> pid;
  return pid;
}

std::string ServeProcess::Address(const std::string& name) const {
  const std::string text = process_->StderrText();
  const std::string key = "specd serve: " + name + " pid ";
  const size_t at = text.rfind(key);
  if (at == std::string::npos) return "";
  const size_t on = text.find(" on ", at);
  return text.substr(on + 4, text.find('\n', on) - on - 4);
}

int ServeProcess::MetricsPort(const std::string& name) const {
  // "coordinator metrics on http://127.0.0.1:PORT/metrics", among serve's start-up lines.
  const std::string key = name + " metrics on http://";
  for (const std::string& line : process_->startup_lines()) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':', key.size());
    return std::atoi(line.c_str() + colon + 1);
  }
  return 0;
}

std::vector<ServeProcess::Stream> ServeProcess::Generate(
    const std::vector<v1::GenerateRequest>& reqs, int after,
    const std::function<void(int finished)>& on_first_tokens) {
  std::mutex mu;
  int started = 0, finished = 0;
  bool hooked = false;  // on_first_tokens has started
  // The hook runs on the stream thread that saw the `after`-th start (or the last finish), which
  // is running then: waking another thread for it could take long enough on a loaded machine for
  // the streams the hook means to catch in flight to finish first.
  const auto hook_if_due = [&](std::unique_lock<std::mutex>& lock) {
    if (!on_first_tokens || hooked) return;
    if (started < after && finished < static_cast<int>(reqs.size())) return;
    hooked = true;
    const int finished_then = finished;
    lock.unlock();
    on_first_tokens(finished_then);
  };
  std::vector<Stream> out(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = stub_->Generate(&ctx, reqs[i]);
      v1::GenerateResponse msg;
      bool first = true;
      while (reader->Read(&msg)) {
        out[i].tokens.insert(out[i].tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
        out[i].text += msg.text();
        out[i].messages.push_back(msg);
        if (first && msg.token_ids_size() > 0) {
          first = false;
          std::unique_lock<std::mutex> lock(mu);
          ++started;
          hook_if_due(lock);
        }
      }
      out[i].status = reader->Finish();
      std::unique_lock<std::mutex> lock(mu);
      ++finished;
      if (!hooked) out[i].done_before_hook = true;
      hook_if_due(lock);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

int64_t ServeProcess::UsedKvBlocks(const std::string& worker) const {
  auto channel = grpc::CreateChannel(Address(worker), grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  worker::v1::InfoResponse info;
  const grpc::Status st =
      worker == "target worker"
          ? worker::v1::TargetWorker::NewStub(channel)->Info(&ctx, worker::v1::InfoRequest(), &info)
          : worker::v1::DraftWorker::NewStub(channel)->Info(&ctx, worker::v1::InfoRequest(), &info);
  if (!st.ok()) return -1;
  return info.kv_total_blocks() - info.kv_free_blocks();
}

void ServeProcess::ExpectNoBlocksUsed() const {
  for (const char* name : {"target worker", "draft worker"}) {
    if (Address(name).empty()) continue;  // no draft worker
    int64_t used = -1;
    for (int i = 0; i < 100; ++i) {
      used = UsedKvBlocks(name);
      if (used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(used, 0) << name;
  }
}

}  // namespace specd::testing
