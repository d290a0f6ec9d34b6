// SPDX-License-Identifier: Apache-2.0
// The pool that runs the functions an RPC agent is called with: a fixed number of threads that
// grows while some of them wait on nested calls, so nested RPCs never deadlock.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "src/common/mutex.h"
#include "src/common/thread_annotations.h"

namespace tutti::rpc::detail {

// Runs tasks on `threads` threads, in submission order.
//
// A task that waits on a future (a nested RPC) declares it with a Blocking scope (FutureState
// does so). While a worker is blocked the pool keeps `threads` unblocked workers by starting a
// helper, which exits once it is surplus (Java's ForkJoinPool "managed blocking"). So at most
// `threads` tasks compute at a time, but a chain of nested calls through this worker, however
// deep, always finds a thread: no deadlock for want of threads (up to kMaxThreads workers).
//
// Any thread. The destructor stops the pool as stop() does.
class ThreadPool {
 public:
  static constexpr int kMaxThreads = 1024;

  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`. Dropped (destroyed unrun) once stop() has begun.
  void submit(std::function<void()> task);
  // True when no task is queued or running.
  bool idle() const;
  // Drops queued tasks, waits for running ones and joins every thread. Idempotent. Not from a
  // pool thread.
  void stop();
  // Whether the calling thread is a worker of some pool.
  static bool on_pool_thread();

  // RAII: while alive, the calling thread, if it is a pool worker, counts as blocked (see the
  // class comment). Nests; does nothing on other threads.
  class Blocking {
   public:
    Blocking();
    ~Blocking();
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;

   private:
    ThreadPool* pool_;
  };

 private:
  void spawn() TUTTI_REQUIRES(mutex_);
  void work() TUTTI_EXCLUDES(mutex_);
  void join_finished() TUTTI_EXCLUDES(mutex_);

  const int target_;
  mutable tutti::detail::Mutex mutex_;
  tutti::detail::CondVar cv_;
  std::deque<std::function<void()>> tasks_ TUTTI_GUARDED_BY(mutex_);
  int alive_ TUTTI_GUARDED_BY(mutex_) = 0;    // Threads in work().
  int running_ TUTTI_GUARDED_BY(mutex_) = 0;  // Threads inside a task, blocked or not.
  int blocked_ TUTTI_GUARDED_BY(mutex_) = 0;  // Threads inside a Blocking scope.
  bool stopping_ TUTTI_GUARDED_BY(mutex_) = false;
  std::map<std::thread::id, std::thread> threads_ TUTTI_GUARDED_BY(mutex_);
  // Exited helpers, not yet joined.
  std::vector<std::thread::id> finished_ TUTTI_GUARDED_BY(mutex_);
};

}  // namespace tutti::rpc::detail
