// SPDX-License-Identifier: Apache-2.0
// DeviceCompletions (Note [Device completion]): ops complete when, and only when, their event
// says the device is done; an event's error fails its ops; fail_all and finish leave nothing
// pending. Events are test doubles whose state the test sets.
#include "src/core/execution/device_completions.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

using std::chrono::milliseconds;

// An event the test completes or fails by hand.
struct Switch {
  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed.
};

class SwitchEvent final : public ops::DeviceEvent {
 public:
  explicit SwitchEvent(std::shared_ptr<Switch> s) : switch_(std::move(s)) {}
  Result<bool> poll() override {
    const int state = switch_->state.load();
    if (state == 2) return Status(ErrorCode::Communication, "kernel failed");
    return state == 1;
  }
  Status wait() override {
    while (switch_->state.load() == 0) std::this_thread::yield();
    return poll().status();
  }

 private:
  std::shared_ptr<Switch> switch_;
};

std::shared_ptr<Entry> new_entry(const std::string& name) {
  auto entry = std::make_shared<Entry>();
  entry->request.name = name;
  entry->state = std::make_shared<detail::OpState>();
  return entry;
}

// Waits (up to 5 s) for `entry` to complete; false if it did not.
bool completes(const Entry& entry) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!entry.state->done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  return entry.state->done();
}

TEST_CASE("Device ops complete when their event does, in any order", "[device]") {
  const Completer completer(nullptr);
  DeviceCompletions completions(completer);
  auto first = std::make_shared<Switch>();
  auto second = std::make_shared<Switch>();
  auto a = new_entry("a");
  auto b = new_entry("b");
  auto c = new_entry("c");
  completions.add(std::make_unique<SwitchEvent>(first), {a, b}, nullptr);
  completions.add(std::make_unique<SwitchEvent>(second), {c}, nullptr);
  std::this_thread::sleep_for(milliseconds(20));
  CHECK(completions.busy());
  CHECK_FALSE(a->state->done());
  // A later stream's event may finish first.
  second->state = 1;
  REQUIRE(completes(*c));
  CHECK(c->state->wait().ok());
  CHECK_FALSE(a->state->done());
  first->state = 1;
  REQUIRE(completes(*a));
  REQUIRE(completes(*b));
  CHECK(a->state->wait().ok());
  CHECK(completions.error().ok());
}

TEST_CASE("A failed event fails its ops and is reported once", "[device]") {
  const Completer completer(nullptr);
  DeviceCompletions completions(completer);
  auto failing = std::make_shared<Switch>();
  auto entry = new_entry("bad");
  completions.add(std::make_unique<SwitchEvent>(failing), {entry}, nullptr);
  failing->state = 2;
  REQUIRE(completes(*entry));
  const Status status = entry->state->wait();
  CHECK(status.code() == ErrorCode::Communication);
  CHECK(status.message() == "kernel failed");
  CHECK(completions.error().code() == ErrorCode::Communication);
}

TEST_CASE("fail_all and finish leave no op pending", "[device]") {
  const Completer completer(nullptr);
  DeviceCompletions completions(completer);
  auto never = std::make_shared<Switch>();
  auto lost = new_entry("lost");
  completions.add(std::make_unique<SwitchEvent>(never), {lost}, nullptr);
  completions.fail_all(Status(ErrorCode::Communication, "peer lost"));
  CHECK(lost->state->done());
  CHECK(lost->state->wait().message() == "peer lost");
  CHECK_FALSE(completions.busy());

  // finish waits for work that completes within its timeout...
  auto soon = std::make_shared<Switch>();
  auto finished = new_entry("finished");
  completions.add(std::make_unique<SwitchEvent>(soon), {finished}, nullptr);
  std::thread device([soon] {
    std::this_thread::sleep_for(milliseconds(50));
    soon->state = 1;
  });
  // ...and fails what is still pending after it.
  auto stuck = new_entry("stuck");
  completions.add(std::make_unique<SwitchEvent>(never), {stuck}, nullptr);
  completions.finish(milliseconds(300), Status(ErrorCode::ShutDown, "shut down"));
  device.join();
  CHECK(finished->state->done());
  CHECK(finished->state->wait().ok());
  CHECK(stuck->state->done());
  CHECK(stuck->state->wait().code() == ErrorCode::ShutDown);
}

}  // namespace
}  // namespace tutti::core
