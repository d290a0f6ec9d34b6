// SPDX-License-Identifier: Apache-2.0
// detail::Mutex::lock_spinning(): it takes the lock only once the holder lets go, whether the
// holder lets go within the spin or long after it (then the waiter sleeps on the lock).
#include "src/common/mutex.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::detail {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// The holder takes the lock, lets the waiter start, keeps the lock for `hold`, marks that it is
// done, and lets go. Returns what the waiter saw once it had the lock: the mark.
bool waiter_saw_release(milliseconds hold, microseconds spin) {
  Mutex mutex;
  std::atomic<bool> waiting{false};
  bool released = false;  // Written under the lock by the holder, read under it by the waiter.
  bool saw = false;
  mutex.lock();
  std::thread waiter([&] {
    waiting.store(true);
    MutexLock lock(mutex, spin);
    saw = released;
  });
  while (!waiting.load()) std::this_thread::yield();
  std::this_thread::sleep_for(hold);
  released = true;
  mutex.unlock();
  waiter.join();
  return saw;
}

TEST_CASE("A spinning lock waits out a holder that keeps the lock past the spin", "[mutex]") {
  // 20 ms held against a 10 us spin: the waiter gives up spinning and sleeps on the lock.
  CHECK(waiter_saw_release(milliseconds(20), microseconds(10)));
}

TEST_CASE("A spinning lock takes the lock a holder lets go within the spin", "[mutex]") {
  // A spin long enough to outlast the hold: the waiter takes the lock while spinning.
  CHECK(waiter_saw_release(milliseconds(1), microseconds(500'000)));
}

TEST_CASE("A spinning lock with no spin, or a free lock, is an ordinary lock", "[mutex]") {
  CHECK(waiter_saw_release(milliseconds(5), microseconds(0)));
  Mutex mutex;
  { MutexLock lock(mutex, microseconds(10)); }
  // Let go at the end of the scope.
  if (mutex.try_lock()) {
    mutex.unlock();
  } else {
    FAIL("the scoped lock kept the mutex");
  }
}

}  // namespace
}  // namespace tutti::detail
