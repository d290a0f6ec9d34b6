// SPDX-License-Identifier: Apache-2.0
// See Note [A waiting thread runs the cycle] in loop_driver.h.
#include "src/core/loop_driver.h"

#include <thread>
#include <utility>

namespace tutti::core {

void LoopDriver::take_over() { drivers_.fetch_add(1, std::memory_order_acq_rel); }

void LoopDriver::drive() {
  bool ran = false;
  bool failed = false;
  if (mutex_.try_lock()) {
    if (cycle_ && failure_.ok()) {
      bool in_flight = false;
      failure_ = cycle_(&in_flight);
      in_flight_.store(in_flight, std::memory_order_relaxed);
      ran = true;
      failed = !failure_.ok();
    }
    mutex_.unlock();
  }
  if (failed) wake_loop();
  // Another thread runs a cycle (on a shared CPU it needs this one to finish it), or the loop
  // has ended and the op waits for the session's end to fail it.
  if (!ran) std::this_thread::yield();
}

void LoopDriver::let_go() {
  drivers_.fetch_sub(1, std::memory_order_acq_rel);
  if (in_flight_.load(std::memory_order_relaxed)) wake_loop();
}

void LoopDriver::hand_back() {
  drivers_.fetch_sub(1, std::memory_order_acq_rel);
  wake_loop();
}

void LoopDriver::attach(Cycle cycle) {
  {
    detail::MutexLock lock(mutex_);
    cycle_ = std::move(cycle);
  }
  detail::MutexLock lock(sleep_mutex_);
  attached_ = true;
}

void LoopDriver::detach() {
  {
    detail::MutexLock lock(mutex_);
    cycle_ = nullptr;
  }
  detail::MutexLock lock(sleep_mutex_);
  attached_ = false;
}

void LoopDriver::sleep_while_driven(std::chrono::microseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  detail::MutexLock lock(sleep_mutex_);
  while (driven() && looked_for_.wait_until(sleep_mutex_, deadline)) {
  }
}

void LoopDriver::wake_loop() {
  // The lock orders the wake-up after a sleeper's check of driven(), which holds it from the
  // check until the wait releases it; and keeps detach() from returning meanwhile.
  detail::MutexLock lock(sleep_mutex_);
  if (!attached_) return;
  looked_for_.notify_all();
  wake_nap_();
}

}  // namespace tutti::core
