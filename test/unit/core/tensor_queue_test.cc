// SPDX-License-Identifier: Apache-2.0
// The queue's table of ops in flight (reused nodes, names viewed in their entries), entries that
// share one allocation with their OpState, and completion racing with waiters.
#include "src/core/tensor_queue.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "src/core/completer.h"

namespace tutti::core {
namespace {

std::shared_ptr<Entry> entry_named(const std::string& name, int set = 0) {
  std::shared_ptr<Entry> entry = make_entry();
  entry->request.name = name;
  entry->request.process_set_id = set;
  return entry;
}

TEST_CASE("The queue refuses a name in flight and takes it again once taken", "[queue]") {
  TensorQueue queue;
  // Names past the small-string buffer: the table's keys view the entries' own names.
  const std::string long_name = "a name well past the small string buffer";
  for (int round = 0; round < 3; ++round) {  // Rounds 1 and 2 reuse round 0's nodes.
    REQUIRE(queue.push(entry_named(long_name)).ok());
    REQUIRE(queue.push(entry_named(long_name, 1)).ok());  // Another set: another op.
    const Status again = queue.push(entry_named(long_name));
    CHECK(again.code() == ErrorCode::InvalidArgument);
    CHECK(again.message() == "an op named '" + long_name +
                                 "' is already in flight (ALLREDUCE); wait for it before "
                                 "reusing the name");
    std::vector<Entry*> drained;
    queue.drain_new(&drained);
    CHECK(drained.size() == 2);
    CHECK_FALSE(queue.empty());
    std::shared_ptr<Entry> taken = queue.take(0, long_name);
    REQUIRE(taken != nullptr);
    CHECK(taken->request.process_set_id == 0);
    CHECK(queue.take(0, long_name) == nullptr);
    CHECK(queue.take(1, long_name) != nullptr);
    CHECK(queue.empty());
  }
}

TEST_CASE("drain_new appends, and hands back entries in push order", "[queue]") {
  TensorQueue queue;
  std::vector<Entry*> drained;
  for (int i = 0; i < 3; ++i) REQUIRE(queue.push(entry_named("a" + std::to_string(i))).ok());
  queue.drain_new(&drained);
  for (int i = 0; i < 2; ++i) REQUIRE(queue.push(entry_named("b" + std::to_string(i))).ok());
  queue.drain_new(&drained);
  std::vector<std::string> names;
  for (const auto& entry : drained) names.push_back(entry->request.name.str());
  CHECK(names == std::vector<std::string>{"a0", "a1", "a2", "b0", "b1"});
  CHECK(queue.drain_new().empty());
  // Automatic names count per set, from 0.
  std::shared_ptr<Entry> unnamed = entry_named("");
  REQUIRE(queue.push(unnamed).ok());
  CHECK(unnamed->request.name == "allreduce.noname.0");
  CHECK(queue.take_set(0).size() == 6);
  CHECK(queue.empty());
}

TEST_CASE("take_all takes each op of a list of any length, and null for names not in flight",
          "[queue]") {
  // Lengths around the pipeline's strides (8 and 16 ops) and its 256 ops per lock; every
  // third name was never pushed.
  const std::size_t length = GENERATE(1, 7, 8, 9, 16, 17, 255, 256, 257, 600);
  TensorQueue queue;
  std::vector<std::string> names(length);
  std::vector<std::shared_ptr<Entry>> pushed(length);
  for (std::size_t i = 0; i < length; ++i) {
    names[i] = "t" + std::to_string(i);
    if (i % 3 == 2) continue;
    pushed[i] = entry_named(names[i], static_cast<int>(i % 2));
    REQUIRE(queue.push(pushed[i]).ok());
  }
  std::vector<TensorQueue::Take> takes(length);
  for (std::size_t i = 0; i < length; ++i) {
    const OpKeyView key{static_cast<int>(i % 2), names[i]};
    takes[i] = TensorQueue::Take{.key = key, .hash = name_hash(key), .entry = nullptr};
  }
  queue.take_all(takes);
  std::size_t right = 0;
  for (std::size_t i = 0; i < length; ++i) right += takes[i].entry == pushed[i] ? 1 : 0;
  CHECK(right == length);
  // Taken means gone: a second pass finds nothing.
  for (TensorQueue::Take& take : takes) take.entry = nullptr;
  queue.take_all(takes);
  CHECK(std::none_of(takes.begin(), takes.end(), [](const auto& t) { return t.entry; }));
}

// Note [Ops not yet drained]: the list of ops to drain points into the entries the queue owns,
// so an op taken before it is drained must leave it (under ASan, a pointer left behind is a
// use after free at the drain).
TEST_CASE("Ops taken before they are drained leave the list to drain; the rest drain in order",
          "[queue]") {
  TensorQueue queue;
  // Pushed by temporaries: the queue holds the only reference to each.
  for (int i = 0; i < 8; ++i) REQUIRE(queue.push(entry_named("n" + std::to_string(i), i / 4)).ok());
  const OpKeyView key2{0, "n2"};
  const OpKeyView key5{1, "n5"};
  std::vector<TensorQueue::Take> takes{
      TensorQueue::Take{.key = key2, .hash = name_hash(key2), .entry = nullptr},
      TensorQueue::Take{.key = key5, .hash = name_hash(key5), .entry = nullptr}};
  SECTION("by name, by a list, and by set") {
    CHECK(queue.take(0, "n0") != nullptr);
    queue.take_all(takes);
    CHECK(takes[0].entry != nullptr);
    CHECK(takes[1].entry != nullptr);
    takes.clear();                         // Their last references: the entries are freed.
    CHECK(queue.take_set(1).size() == 3);  // n4, n6, n7.
    std::vector<std::string> names;
    for (const Entry* entry : queue.drain_new()) names.push_back(entry->request.name.str());
    CHECK(names == std::vector<std::string>{"n1", "n3"});
  }
  SECTION("a drained op taken later, while others wait, leaves them in the list") {
    CHECK(queue.drain_new().size() == 8);
    REQUIRE(queue.push(entry_named("late")).ok());
    queue.take_all(takes);
    CHECK(takes[0].entry != nullptr);
    takes.clear();
    const std::vector<Entry*> drained = queue.drain_new();
    REQUIRE(drained.size() == 1);
    CHECK(drained[0]->request.name == "late");
  }
  SECTION("a refused duplicate is left to its caller, whole") {
    std::shared_ptr<Entry> twin = entry_named("n1");
    CHECK(queue.push(twin).code() == ErrorCode::InvalidArgument);
    CHECK(twin->request.name == "n1");
    CHECK(queue.drain_new().size() == 8);
  }
}

// Note [Views kept without their shapes]: what runs an op reads the rest of its views.
TEST_CASE("A view an op keeps loses its shape and nothing else", "[queue]") {
  std::vector<double> data(6);
  TensorView view(data.data(), {2, 3});
  detail::TensorViewAccess::drop_shape(view);
  CHECK(view.shape().empty());
  CHECK(view.data() == data.data());
  CHECK(view.dtype() == DataType::Float64);
  CHECK(view.device() == Device::cpu());
  CHECK(view.num_elements() == 6);
  CHECK(view.byte_size() == 48);
  CHECK(view.span<double>().size() == 6);
}

TEST_CASE("close() fails later pushes and returns what is in flight", "[queue]") {
  TensorQueue queue;
  REQUIRE(queue.push(entry_named("x")).ok());
  REQUIRE(queue.push(entry_named("y")).ok());
  static_cast<void>(queue.take(0, "x"));
  const std::vector<std::shared_ptr<Entry>> pending =
      queue.close(Status(ErrorCode::ShutDown, "closed"));
  REQUIRE(pending.size() == 1);
  CHECK(pending[0]->request.name == "y");
  CHECK(queue.push(entry_named("z")).code() == ErrorCode::ShutDown);
}

TEST_CASE("An entry and its state share one allocation; the handle keeps both", "[queue]") {
  std::weak_ptr<Entry> watch;
  std::shared_ptr<detail::OpState> state;
  {
    std::shared_ptr<Entry> entry = entry_named("w");
    watch = entry;
    state = handle_state(entry);
    CHECK(state.get() == entry->state.get());
  }
  CHECK_FALSE(watch.expired());  // The handle's pointer owns the entry's allocation.
  Completer completer(nullptr);
  completer.complete(*watch.lock(), Status());
  CHECK(state->done());
  CHECK(state->wait().ok());
  state.reset();
  CHECK(watch.expired());  // Nothing left: no cycle through Entry::state.
}

TEST_CASE("Completion wakes waiters that sleep, and skips the lock when none do", "[queue]") {
  // Waiters past their spin sleep on the op's done flag (a futex); completions race with them.
  // Every waiter must return with the op's status (the test hangs otherwise; ThreadSanitizer checks
  // the orderings).
  constexpr int kOps = 200;
  Completer completer(nullptr);
  std::vector<std::shared_ptr<Entry>> entries;
  std::vector<std::shared_ptr<detail::OpState>> states;
  for (int i = 0; i < kOps; ++i) {
    entries.push_back(entry_named("op" + std::to_string(i)));
    states.push_back(handle_state(entries.back()));
  }
  std::atomic<int> ok{0};
  std::thread waiter([&] {
    for (const auto& state : states) ok += state->wait().code() == ErrorCode::Mismatch ? 1 : 0;
  });
  for (int i = 0; i < kOps; ++i) {
    // Now and then slower than the waiter's spin, so that it sleeps.
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    completer.complete(*entries[static_cast<std::size_t>(i)], Status(ErrorCode::Mismatch, "no"));
  }
  waiter.join();
  CHECK(ok.load() == kOps);
}

TEST_CASE("A queue that spins on its lock loses and repeats no op pushed during drains",
          "[queue]") {
  // Note [The queue's lock on spare CPUs]: a submitting thread and a draining one contend for
  // the lock thousands of times; every op comes out once, in push order, and is taken once.
  constexpr int kOps = 20'000;
  TensorQueue queue;
  queue.spin_on_contention(std::chrono::microseconds(20));
  std::atomic<int> refused{0};  // Catch's assertions are for the test's own thread.
  std::thread pusher([&] {
    for (int i = 0; i < kOps; ++i) {
      if (!queue.push(entry_named("op" + std::to_string(i))).ok()) refused.fetch_add(1);
    }
  });
  std::vector<Entry*> batch;
  std::vector<std::int64_t> sequences;
  int taken = 0;
  while (taken < kOps - refused.load()) {
    batch.clear();
    queue.drain_new(&batch);
    std::vector<TensorQueue::Take> takes;
    for (Entry* entry : batch) {
      sequences.push_back(entry->sequence);
      const OpKeyView key{0, entry->request.name};
      takes.push_back({.key = key, .hash = name_hash(key), .entry = nullptr});
    }
    queue.take_all(takes);
    for (const TensorQueue::Take& take : takes) taken += take.entry != nullptr ? 1 : 0;
  }
  pusher.join();
  REQUIRE(refused.load() == 0);
  REQUIRE(sequences.size() == static_cast<std::size_t>(kOps));
  for (std::size_t i = 0; i < sequences.size(); ++i)
    CHECK(sequences[i] == static_cast<std::int64_t>(i));
  CHECK(queue.empty());
}

TEST_CASE("An op's results are empty until written; one output fills output and outputs",
          "[queue]") {
  std::shared_ptr<Entry> entry = entry_named("r");
  detail::OpState& state = *entry->state;
  CHECK(state.results().output.num_elements() == 0);
  CHECK(state.results().outputs.empty());
  CHECK(state.results().source == -1);
  const Tensor tensor = Tensor::from<float>(std::vector<float>{1, 2, 3}, {3});
  state.mutable_results().set_output(tensor);
  state.mutable_results().source = 4;
  CHECK(state.results().output.data() == tensor.data());
  REQUIRE(state.results().outputs.size() == 1);
  CHECK(state.results().outputs[0].data() == tensor.data());
  CHECK(state.results().source == 4);
  // Another op's results are its own.
  CHECK(entry_named("q")->state->results().outputs.empty());
}

}  // namespace
}  // namespace tutti::core
