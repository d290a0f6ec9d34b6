// SPDX-License-Identifier: Apache-2.0
// LoopDriver (Note [A waiting thread runs the cycle] in src/core/loop_driver.h), with a
// counting cycle in place of the loop's: drive() runs the cycle only between attach() and the
// end of driving, never while another thread holds the cycle lock, and never after a failed
// cycle; poll() runs none; let_go() wakes the loop only with ops left in flight, hand_back()
// always; the loop's sleep ends when a driver hands back.
#include "src/core/loop_driver.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using std::chrono::milliseconds;

// A driver whose cycle counts its runs and returns `result`, leaving `in_flight` ops.
struct Fixture {
  std::atomic<int> cycles{0};
  std::atomic<int> wakes{0};  // Calls of the loop's wake-up (TensorQueue::wake in a session).
  Status result;
  bool in_flight = false;
  LoopDriver driver{true, [this] { ++wakes; }};

  void attach() {
    driver.attach([this](bool* left) {
      ++cycles;
      *left = in_flight;
      return result;
    });
  }
};

TEST_CASE("drive() runs the cycle only between attach() and the end of driving", "[loop_driver]") {
  Fixture f;
  f.driver.drive();
  CHECK(f.cycles == 0);
  f.attach();
  f.driver.drive();
  CHECK(f.cycles == 1);
  SECTION("detach") { f.driver.detach(); }
  SECTION("stop_driving, under the lock") {
    detail::MutexLock lock(f.driver.cycle_mutex());
    f.driver.stop_driving();
  }
  f.driver.drive();
  CHECK(f.cycles == 1);
}

TEST_CASE("poll() runs no cycle: Handle::poll never blocks", "[loop_driver]") {
  Fixture f;
  f.attach();
  f.driver.poll();
  CHECK(f.cycles == 0);
}

TEST_CASE("drive() runs nothing while another thread holds the cycle lock", "[loop_driver]") {
  Fixture f;
  f.attach();
  {
    detail::MutexLock lock(f.driver.cycle_mutex());
    std::thread([&] { f.driver.drive(); }).join();
  }
  CHECK(f.cycles == 0);
  f.driver.drive();
  CHECK(f.cycles == 1);
}

TEST_CASE("a failed cycle is kept for the loop, wakes it, and no cycle is driven after it",
          "[loop_driver]") {
  Fixture f;
  f.result = Status(ErrorCode::Communication, "the peer is gone");
  f.attach();
  f.driver.drive();
  CHECK(f.wakes == 1);
  f.driver.drive();
  CHECK(f.cycles == 1);
  detail::MutexLock lock(f.driver.cycle_mutex());
  CHECK(f.driver.failure().code() == ErrorCode::Communication);
  CHECK(f.driver.failure().message() == "the peer is gone");
}

TEST_CASE("let_go() wakes the loop only with ops left in flight; hand_back() always",
          "[loop_driver]") {
  Fixture f;
  f.attach();
  f.driver.take_over();
  CHECK(f.driver.driven());
  f.driver.drive();
  f.driver.let_go();
  CHECK_FALSE(f.driver.driven());
  CHECK(f.wakes == 0);

  f.in_flight = true;
  f.driver.take_over();
  f.driver.drive();
  f.driver.let_go();
  CHECK(f.wakes == 1);

  f.in_flight = false;
  f.driver.take_over();
  f.driver.hand_back();
  CHECK(f.wakes == 2);

  // After the loop has ended a hand-back reaches nothing (the session may be gone).
  f.driver.detach();
  f.driver.take_over();
  f.driver.hand_back();
  CHECK(f.wakes == 2);
}

TEST_CASE("the loop's sleep while a thread drives ends when it hands back", "[loop_driver]") {
  Fixture f;
  f.attach();
  f.driver.take_over();
  auto slept = std::async(std::launch::async, [&] {
    const auto start = std::chrono::steady_clock::now();
    f.driver.sleep_while_driven(std::chrono::seconds(30));
    return std::chrono::steady_clock::now() - start;
  });
  std::this_thread::sleep_for(milliseconds(50));
  REQUIRE(slept.wait_for(milliseconds(0)) == std::future_status::timeout);  // Still asleep.
  f.driver.hand_back();
  // Woken, not timed out: well within the 30 s it would otherwise sleep.
  REQUIRE(slept.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(slept.get() < std::chrono::seconds(10));
}

TEST_CASE("the loop does not sleep while nobody drives", "[loop_driver]") {
  Fixture f;
  f.attach();
  const auto start = std::chrono::steady_clock::now();
  f.driver.sleep_while_driven(std::chrono::seconds(30));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

}  // namespace
}  // namespace tutti::core
