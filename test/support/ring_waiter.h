// SPDX-License-Identifier: Apache-2.0
// The coordinator's side of a bell's test (ops/mpi/doorbell.h, ops/mpi/net_bell.h): a thread in
// wait_for_ring(), and the check that stop_ring_waits() ends such waits.
#pragma once

#include <chrono>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::test {

// A thread in `bell`'s wait_for_ring(), its answer to be had within a limit (else the wait is
// stopped and the answer is false).
template <class Bell>
class RingWaiter {
 public:
  explicit RingWaiter(Bell& bell)
      : bell_(bell),
        answer_(std::async(std::launch::async, [&bell] { return bell.wait_for_ring(); })) {}
  // `in_time`: whether the answer came within `limit`.
  bool get(std::chrono::milliseconds limit, bool* in_time) {
    *in_time = answer_.wait_for(limit) == std::future_status::ready;
    if (!*in_time) bell_.stop_ring_waits();
    return answer_.get();
  }

 private:
  Bell& bell_;
  std::future<bool> answer_;
};

// stop_ring_waits() ends a wait with false, and every later one at once.
template <class Bell>
void check_stop_ends_waits(Bell& bell) {
  using namespace std::chrono_literals;
  RingWaiter<Bell> stopped(bell);
  std::this_thread::sleep_for(10ms);  // Time to fall asleep, so that the stop has to wake it.
  bell.stop_ring_waits();
  bool in_time = false;
  CHECK_FALSE(stopped.get(60s, &in_time));
  CHECK(in_time);
  CHECK_FALSE(bell.wait_for_ring());
}

}  // namespace tutti::test
