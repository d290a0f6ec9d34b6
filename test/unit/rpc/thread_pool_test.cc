// SPDX-License-Identifier: Apache-2.0
// The RPC callee's thread pool on its own: tasks run once each and in submission order on one
// thread, a Blocking task does not starve the queue, and a task refused after stop() is
// destroyed outside the pool's lock. Waits are bounded, so a broken pool fails, not hangs.
#include "src/rpc/thread_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace tutti::rpc::detail {
namespace {

using namespace std::chrono_literals;

// Polls `done` for up to 20 s; whether it came true.
template <class Done>
bool eventually(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST_CASE("A one-thread pool runs every task once, in submission order", "[rpc][pool]") {
  constexpr int kTasks = 2000;
  std::mutex mutex;
  std::vector<int> order;
  ThreadPool pool(1);  // Last: stopped before what its tasks touch goes.
  for (int i = 0; i < kTasks; ++i) {
    pool.submit([&, i] {
      const std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
    });
  }
  REQUIRE(eventually([&] { return pool.idle(); }));
  const std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(order.size() == kTasks);
  for (int i = 0; i < kTasks; ++i) REQUIRE(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("Tasks submitted from many threads at once all run once", "[rpc][pool]") {
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::atomic<int>> runs(kThreads * kEach);
  ThreadPool pool(3);
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) pool.submit([&runs, k = t * kEach + i] { ++runs[k]; });
    });
  }
  for (std::thread& s : submitters) s.join();
  REQUIRE(eventually([&] { return pool.idle(); }));
  for (const std::atomic<int>& r : runs) REQUIRE(r.load() == 1);
}

TEST_CASE("A task blocked in a Blocking scope leaves a thread for the task it waits on",
          "[rpc][pool]") {
  // One thread: without the scope's helper, the second task could never run while the first
  // waits for it.
  std::promise<void> second_ran;
  std::future<void> ran = second_ran.get_future();
  std::atomic<bool> first_saw_it{false};
  ThreadPool pool(1);
  pool.submit([&] {
    const ThreadPool::Blocking blocking;
    first_saw_it = ran.wait_for(20s) == std::future_status::ready;
  });
  pool.submit([&] { second_ran.set_value(); });
  REQUIRE(eventually([&] { return pool.idle(); }));
  REQUIRE(first_saw_it);
}

// Calls back into the pool as it is destroyed, which deadlocks if that happens under the
// pool's lock (the lock is not recursive).
class CallsBack {
 public:
  CallsBack(ThreadPool* pool, std::atomic<bool>* destroyed) : pool_(pool), destroyed_(destroyed) {}
  CallsBack(const CallsBack&) = delete;
  CallsBack& operator=(const CallsBack&) = delete;
  ~CallsBack() {
    static_cast<void>(pool_->idle());
    *destroyed_ = true;
  }

 private:
  ThreadPool* pool_;
  std::atomic<bool>* destroyed_;
};

TEST_CASE("A task submitted after stop() is destroyed unrun, outside the pool's lock",
          "[rpc][pool]") {
  auto pool = std::make_shared<ThreadPool>(2);
  pool->stop();
  auto ran = std::make_shared<std::atomic<bool>>(false);
  auto destroyed = std::make_shared<std::atomic<bool>>(false);
  // On a thread of its own, so that a deadlock fails the case instead of hanging it (the
  // thread is then left behind, holding the pool).
  std::thread submitter([pool, ran, destroyed] {
    auto owned = std::make_shared<CallsBack>(pool.get(), destroyed.get());
    pool->submit([owned = std::move(owned), ran] { *ran = true; });
  });
  const bool finished = eventually([&] { return destroyed->load(); });
  if (finished) {
    submitter.join();
  } else {
    submitter.detach();
  }
  REQUIRE(finished);
  REQUIRE_FALSE(ran->load());
}

}  // namespace
}  // namespace tutti::rpc::detail
