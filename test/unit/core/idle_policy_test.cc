// SPDX-License-Identifier: Apache-2.0
// idle_pause(): what the communication thread does between cycles that found no work (Notes
// [The cycle] and [Waiting on a shared CPU] in background_loop.h).
#include "src/core/idle_policy.h"

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using std::chrono::microseconds;

// The loop polls on: it naps not at all, and yields the CPU before its next poll.
void check_polls(const IdleFacts& facts) {
  const Pause pause = idle_pause(facts);
  CHECK(pause.yield);
  CHECK(pause.nap == microseconds{0});
}

// The loop naps `nap` on the queue, and does not yield first.
void check_naps(const IdleFacts& facts, microseconds nap) {
  const Pause pause = idle_pause(facts);
  CHECK_FALSE(pause.yield);
  CHECK(pause.nap == nap);
}

TEST_CASE("While a thread waits the loop polls for kSpinTime, yielding between polls", "[idle]") {
  // The yield is what hands the CPU to the thread a completion just woke, where the two share
  // one: a woken thread did not preempt a loop that polled without yielding (Linux 6.18).
  check_polls({.idle = microseconds{0}, .app_waiting = true});
  check_polls({.idle = kSpinTime - microseconds{1}, .app_waiting = true, .queue_empty = false});
  // Then it naps, an eighth of the idle time, at least kMinNap.
  check_naps({.idle = kSpinTime, .app_waiting = true}, kMinNap);
  check_naps({.idle = microseconds{400}, .app_waiting = true}, microseconds{50});
}

TEST_CASE("Nobody waiting, the loop naps at once, longer as it idles, up to a cap", "[idle]") {
  // The core is the application's: a hook's submission wakes the loop, and the loop goes back
  // to sleep rather than poll through the backward pass.
  check_naps({.idle = microseconds{0}}, kMinNap);
  check_naps({.idle = microseconds{800}}, microseconds{100});
  // Ops in flight: the nap is capped short, since an answer may come soon.
  check_naps({.idle = microseconds{100'000}, .queue_empty = false}, kBusyCap);
  // Nothing in flight: an idle job wakes about a hundred times a second (P4).
  check_naps({.idle = microseconds{100'000}}, kIdleCap);
  check_naps({.idle = microseconds{1'000'000}}, kIdleCap);
  CHECK(kBusyCap < kIdleCap);
}

TEST_CASE("Where no message needs a prompt look, an idle loop naps up to kQuietCap", "[idle]") {
  // Note [Quiet naps]: about ten wake-ups a second once idle for 0.8 s.
  check_naps({.idle = microseconds{100'000}, .messages_may_wait = true}, microseconds{12'500});
  check_naps({.idle = 8 * kQuietCap, .messages_may_wait = true}, kQuietCap);
  check_naps({.idle = microseconds{10'000'000}, .messages_may_wait = true}, kQuietCap);
  CHECK(kIdleCap < kQuietCap);
  // Anything in flight still caps the nap short.
  check_naps({.idle = microseconds{10'000'000}, .queue_empty = false, .messages_may_wait = true},
             kBusyCap);
  check_naps({.idle = microseconds{10'000'000}, .p2p_busy = true, .messages_may_wait = true},
             kBusyCap);
  // And what keeps it polling still does.
  check_polls({.idle = microseconds{10'000'000}, .receiving = true, .messages_may_wait = true});
}

TEST_CASE("A message partly received keeps the loop polling however long", "[idle]") {
  check_polls({.idle = microseconds{0}, .receiving = true});
  check_polls({.idle = microseconds{1'000'000}, .receiving = true});
}

TEST_CASE("Point-to-point ops keep the loop polling for kP2PSpinTime, or while a thread waits",
          "[idle]") {
  check_polls({.idle = kP2PSpinTime - microseconds{1}, .p2p_busy = true});
  // A large message's progress is invisible until it is through: a waiting thread keeps the
  // loop polling past kP2PSpinTime, else the transfer would move a fragment per nap.
  check_polls({.idle = microseconds{1'000'000}, .app_waiting = true, .p2p_busy = true});
  // Nobody waiting past kP2PSpinTime: naps capped short (an eighth of 2 ms is over the cap),
  // the ops are still in flight.
  CHECK(kP2PSpinTime / 8 > kBusyCap);
  check_naps({.idle = kP2PSpinTime, .p2p_busy = true}, kBusyCap);
  CHECK(kSpinTime < kP2PSpinTime);
}

}  // namespace
}  // namespace tutti::core
