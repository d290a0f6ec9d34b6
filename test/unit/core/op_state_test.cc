// SPDX-License-Identifier: Apache-2.0
// OpState finds its driver by kind (Note [Drivers by kind] in src/core/op_state.cc): a thread
// that waits on, polls or drives an op that is not done uses the running session's driver of
// the op's kind, and none where the op names none or that driver is gone.
#include "src/core/op_state.h"

#include <chrono>
#include <memory>
#include <thread>

#include <catch2/catch.hpp>

#include "src/core/completer.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {
namespace {

// Completes its op at its `done_at`-th drive, and counts what a waiting thread asked of it.
struct CountingDriver final : detail::Driver {
  CountingDriver(const Completer& completer, Entry& entry, int done_at)
      : completer(completer), entry(entry), done_at(done_at) {}
  void take_over() override { ++take_overs; }
  void drive() override {
    if (++drives == done_at) completer.complete(entry, Status());
  }
  void let_go() override { ++let_goes; }
  void hand_back() override { ++hand_backs; }

  const Completer& completer;
  Entry& entry;
  int done_at;
  int drives = 0, take_overs = 0, let_goes = 0, hand_backs = 0;
};

// Never completes its op; each step takes at least 100 us.
struct SlowDriver final : detail::Driver {
  void drive() override {
    ++drives;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  void hand_back() override {}
  int drives = 0;
};

TEST_CASE("A waiting thread drives an op with the running session's driver of its kind",
          "[op_state]") {
  const Completer completer(nullptr);
  const std::shared_ptr<Entry> looped = make_entry();
  const std::shared_ptr<Entry> paired = make_entry();
  const auto loop = std::make_shared<CountingDriver>(completer, *looped, 3);
  const auto point_to_point = std::make_shared<CountingDriver>(completer, *paired, 2);
  detail::set_drivers(loop, point_to_point);
  looped->state->driver = detail::DriverKind::Loop;
  paired->state->driver = detail::DriverKind::PointToPoint;

  CHECK(handle_state(looped)->wait().ok());
  CHECK(loop->drives == 3);
  CHECK(loop->take_overs == 1);
  CHECK(loop->let_goes == 1);
  CHECK(loop->hand_backs == 0);
  CHECK(point_to_point->drives == 0);

  // poll() steps the op's driver once a call (Driver::poll() is drive() by default).
  CHECK_FALSE(handle_state(paired)->poll());
  CHECK(point_to_point->drives == 1);
  CHECK(handle_state(paired)->poll());
  CHECK(point_to_point->drives == 2);
  CHECK(loop->drives == 3);
  detail::set_drivers({}, {});
}

TEST_CASE("An op of no driver kind, or whose driver is gone, is not driven", "[op_state]") {
  const Completer completer(nullptr);
  const std::shared_ptr<Entry> entry = make_entry();
  auto loop = std::make_shared<CountingDriver>(completer, *entry, 1);
  detail::set_drivers(loop, {});
  // DriverKind::None (the default): a waiting thread leaves the op to the communication thread.
  CHECK_FALSE(handle_state(entry)->drive_for(std::chrono::milliseconds(1)));
  CHECK_FALSE(handle_state(entry)->poll());
  CHECK(loop->drives == 0);
  // A point-to-point op while the session has no such driver.
  entry->state->driver = detail::DriverKind::PointToPoint;
  CHECK_FALSE(handle_state(entry)->drive_for(std::chrono::milliseconds(1)));
  // A loop op whose session (and its driver) is gone.
  entry->state->driver = detail::DriverKind::Loop;
  loop.reset();
  CHECK_FALSE(handle_state(entry)->drive_for(std::chrono::milliseconds(1)));
  CHECK_FALSE(handle_state(entry)->done());
  // A new session's driver drives it.
  const auto next = std::make_shared<CountingDriver>(completer, *entry, 1);
  detail::set_drivers(next, {});
  CHECK(handle_state(entry)->drive_for(std::chrono::milliseconds(100)));
  CHECK(next->drives == 1);
  detail::set_drivers({}, {});
}

TEST_CASE("drive_for() stops within kStepsPerClockRead steps of its deadline", "[op_state]") {
  // SlowDriver never completes its op and takes at least 100 us a step: within 1 ms at most
  // 10 steps fit, and the clock, read every kStepsPerClockRead steps, ends it after at most
  // kStepsPerClockRead - 1 more. A slower machine only makes the steps longer, so fewer.
  const std::shared_ptr<Entry> entry = make_entry();
  const auto slow = std::make_shared<SlowDriver>();
  detail::set_drivers({}, slow);
  entry->state->driver = detail::DriverKind::PointToPoint;
  CHECK_FALSE(handle_state(entry)->drive_for(std::chrono::milliseconds(1)));
  CHECK(slow->drives >= 1);
  CHECK(slow->drives <= 10 + static_cast<int>(detail::OpState::kStepsPerClockRead) - 1);
  detail::set_drivers({}, {});
}

}  // namespace
}  // namespace tutti::core
