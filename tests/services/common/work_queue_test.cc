// WorkQueue: tasks run on its threads, not the poster's, several at once; Stop runs what is
// queued before it returns; and a task posted after Stop still runs, on the poster's thread.
#include "services/common/work_queue.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(WorkQueueTest, TasksRunOffThePostersThreadAndConcurrently) {
  WorkQueue queue(2);
  const std::thread::id poster = std::this_thread::get_id();
  // The first task blocks until the second has run: with one thread, or tasks run by the
  // poster, this would never finish.
  absl::Notification second_ran;
  std::promise<std::thread::id> first_thread;
  std::promise<std::thread::id> second_thread;
  queue.Post([&] {
    second_ran.WaitForNotificationWithTimeout(absl::Seconds(60));
    first_thread.set_value(std::this_thread::get_id());
  });
  queue.Post([&] {
    second_thread.set_value(std::this_thread::get_id());
    second_ran.Notify();
  });
  std::future<std::thread::id> first = first_thread.get_future();
  ASSERT_EQ(first.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(second_ran.HasBeenNotified()) << "the two tasks did not run at the same time";
  const std::thread::id a = first.get();
  const std::thread::id b = second_thread.get_future().get();
  EXPECT_NE(a, poster);
  EXPECT_NE(b, poster);
  EXPECT_NE(a, b);
}

TEST(WorkQueueTest, StopRunsEveryQueuedTaskAndLaterPostsRunInline) {
  std::atomic<int> ran{0};
  WorkQueue queue(1);
  absl::Notification release;
  queue.Post([&] { release.WaitForNotification(); });
  for (int i = 0; i < 100; ++i) queue.Post([&] { ran.fetch_add(1); });
  std::thread stopper([&] { queue.Stop(); });
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran.load(), 100) << "Stop returned before the queued tasks ran";

  std::thread::id where;
  queue.Post([&] { where = std::this_thread::get_id(); });
  EXPECT_EQ(where, std::this_thread::get_id());
  queue.Stop();  // idempotent
}

}  // namespace
}  // namespace specd
