// SPDX-License-Identifier: Apache-2.0
// Completer::Batch (Note [Waking a batch at its end]): a thread asleep on an op of a batch
// wakes after the batch's last op is done, with its own op's status, even where the caller
// dropped the entry before the batch ended; a lone completion wakes its waiter at once.
#include "src/core/completer.h"

#include <chrono>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using std::chrono::milliseconds;

// Long enough that a thread started before it is asleep in OpState::wait() by its end (the
// wait spins 20 us at most), short enough to keep the test quick.
constexpr milliseconds kSettle{50};

TEST_CASE("A batch wakes the threads asleep on its ops after its last op", "[completer]") {
  const Completer completer(nullptr);
  std::shared_ptr<Entry> first = make_entry();
  std::shared_ptr<Entry> last = make_entry();
  // Held as a Handle holds it: the test drops `first` itself inside the batch.
  const std::shared_ptr<detail::OpState> first_state = handle_state(first);
  const std::shared_ptr<detail::OpState> last_state = handle_state(last);
  auto woke = std::async(std::launch::async, [&] {
    const Status status = first_state->wait();
    return std::make_pair(status.ok(), last_state->done());
  });
  std::this_thread::sleep_for(kSettle);
  {
    Completer::Batch batch(completer);
    batch.complete(first, Status());
    first.reset();  // The batch must keep what it wakes alive on its own.
    // Woken here, the waiter would find `last` not done for another kSettle.
    std::this_thread::sleep_for(kSettle);
    REQUIRE(woke.wait_for(milliseconds(0)) == std::future_status::timeout);
    batch.complete(last, Status(ErrorCode::Internal, "the last op failed"));
  }
  REQUIRE(woke.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  const auto [first_ok, last_done] = woke.get();
  CHECK(first_ok);
  CHECK(last_done);
  const Status last_status = last_state->wait();
  CHECK(last_status.code() == ErrorCode::Internal);
  CHECK(last_status.message() == "the last op failed");
}

TEST_CASE("A lone completion wakes its waiter at once", "[completer]") {
  const Completer completer(nullptr);
  std::shared_ptr<Entry> entry = make_entry();
  const std::shared_ptr<detail::OpState> state = handle_state(entry);
  auto woke = std::async(std::launch::async, [&] { return state->wait().ok(); });
  std::this_thread::sleep_for(kSettle);
  completer.complete(*entry, Status());
  REQUIRE(woke.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(woke.get());
}

}  // namespace
}  // namespace tutti::core
