// SPDX-License-Identifier: Apache-2.0
// std::mutex and std::condition_variable with clang's thread-safety annotations (libstdc++'s
// own are not annotated), so TUTTI_GUARDED_BY members are checked. Header-only: the training
// layers may use it too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "src/common/thread_annotations.h"

namespace tutti::detail {

class TUTTI_CAPABILITY("mutex") Mutex {
 public:
  void lock() TUTTI_ACQUIRE() { mutex_.lock(); }
  void unlock() TUTTI_RELEASE() { mutex_.unlock(); }
  // Takes the lock if it is free; true if it did.
  bool try_lock() TUTTI_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mutex_;
};

// Holds `mutex` for its lifetime.
class TUTTI_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) TUTTI_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() TUTTI_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// A condition variable for Mutex. wait() and wait_until() release `mutex` while they sleep and
// hold it again when they return, like std::condition_variable's; they may wake spuriously,
// so callers loop on their condition (which the analysis then checks under the lock):
//   while (!ready_) cv_.wait(mutex_);
class CondVar {
 public:
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

  void wait(Mutex& mutex) TUTTI_REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.mutex_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // Still held: the caller's MutexLock unlocks it.
  }
  // False once `deadline` has passed.
  template <class Clock, class Duration>
  bool wait_until(Mutex& mutex, std::chrono::time_point<Clock, Duration> deadline)
      TUTTI_REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.mutex_, std::adopt_lock);
    const bool in_time = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return in_time;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace tutti::detail
