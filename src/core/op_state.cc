// SPDX-License-Identifier: Apache-2.0
#include "src/core/op_state.h"

#include <chrono>
#include <thread>

#include "src/common/check.h"

namespace tutti::detail {

void OpState::complete(Status status) {
  TUTTI_CHECK(!done(), "an op was completed twice");
  status_ = std::move(status);
  {
    // The lock orders the store against a waiter that checked done() and is about to sleep.
    MutexLock lock(mutex_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

Status OpState::wait() const {
  // A short spin first: a small op finishes within microseconds, and a futex sleep and
  // wake-up would double its latency.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
  while (!done() && std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
  if (!done()) {
    MutexLock lock(mutex_);
    while (!done()) cv_.wait(mutex_);
  }
  return status_;
}

}  // namespace tutti::detail
