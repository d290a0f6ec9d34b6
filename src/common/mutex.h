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

// A hint to the CPU that this thread spins on a value another CPU will change.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class TUTTI_CAPABILITY("mutex") Mutex {
 public:
  void lock() TUTTI_ACQUIRE() { mutex_.lock(); }
  // lock(), but while another thread holds the lock, first tries again for up to `spin` before
  // sleeping on it: for locks held for a few microseconds by a thread on another CPU, where a
  // sleep and a wake-up (two system calls, a context switch) cost more than the wait. Never
  // where the holder may run on this thread's CPU: it cannot let go while this thread spins.
  // A zero `spin` is lock().
  void lock_spinning(std::chrono::nanoseconds spin) TUTTI_ACQUIRE() {
    if (mutex_.try_lock()) return;
    if (spin.count() > 0) {
      const auto until = std::chrono::steady_clock::now() + spin;
      do {
        for (int i = 0; i < 16; ++i) cpu_relax();
        if (mutex_.try_lock()) return;
      } while (std::chrono::steady_clock::now() < until);
    }
    mutex_.lock();
  }
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
  // With Mutex::lock_spinning(spin).
  MutexLock(Mutex& mutex, std::chrono::nanoseconds spin) TUTTI_ACQUIRE(mutex) : mutex_(mutex) {
    mutex_.lock_spinning(spin);
  }
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
