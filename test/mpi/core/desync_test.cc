// SPDX-License-Identifier: Apache-2.0
// TUTTI_DEBUG=DETAIL's desync check (Note [Desync check] in
// src/core/negotiation/desync_check.h) in real jobs: ranks that keep one order per set train as
// usual, uneven joins and process sets included; a rank that skips or reorders an op fails
// every rank with Mismatch naming both ranks' ops, long before a stall could. Run with
// TUTTI_DEBUG=DETAIL and stall limits of 30 s and 60 s (see meson.build), so that a quick
// failure can only come from the check. Expected sums are closed forms of the ranks' numbers.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// How long a desync may take to fail every rank: the check needs only both ranks' requests at
// the coordinator, a few cycles; the stall shutdown (60 s in meson.build) would take far longer.
double desync_bound_seconds() { return 10 * time_scale(); }

// Runs `ops`; returns the error every op that failed reported, joined, or "" if none failed.
std::string failures(std::vector<Handle>& handles) {
  std::string all;
  for (Handle& h : handles) {
    try {
      h.wait();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Mismatch) all += "[not Mismatch] ";
      all += std::string(e.what()) + "\n";
    }
  }
  return all;
}

TEST_CASE("ranks that keep one order per set train as usual, joins and sets included", "[desync]") {
  init();
  const int size = world_size();
  const int rank = world_rank();
  // Rank r trains 2 + r steps, then joins: the others go on without it.
  const int my_steps = 2 + rank;
  for (int s = 0; s < my_steps; ++s) {
    std::vector<float> a(3, static_cast<float>(rank + 1));
    std::vector<float> b(5, 1.0f);
    std::vector<Handle> handles;
    handles.push_back(allreduce_async(TensorView(a.data(), {3}), "grad.a", {.op = ReduceOp::Sum}));
    handles.push_back(allreduce_async(TensorView(b.data(), {5}), "grad.b", {.op = ReduceOp::Sum}));
    for (Handle& h : handles) h.wait();
    // Ranks still training at step s are those with 2 + r > s, i.e. r >= s - 1.
    float expected_a = 0;
    float expected_b = 0;
    for (int r = 0; r < size; ++r) {
      if (2 + r > s) {
        expected_a += static_cast<float>(r + 1);
        expected_b += 1.0f;
      }
    }
    CHECK(a[0] == expected_a);
    CHECK(b[4] == expected_b);
  }
  CHECK(all_ranks(join() == size - 1));  // The rank with the most steps joins last.
  // After the join every rank's places start again: the same ops line up.
  std::vector<float> one(2, 1.0f);
  allreduce(TensorView(one.data(), {2}), "after.join", {.op = ReduceOp::Sum});
  CHECK(all_ranks(one[0] == static_cast<float>(size)));
  std::vector<float> root(4, static_cast<float>(rank));
  broadcast(TensorView(root.data(), {4}), size - 1, "weights");
  CHECK(all_ranks(root[3] == static_cast<float>(size - 1)));
  // A set of some ranks (not all: a set equal to the global one is refused) numbers its own.
  const std::vector<int> members = size >= 3 ? std::vector<int>{0, 1} : std::vector<int>{0};
  const ProcessSet some = add_process_set(members);
  if (rank < static_cast<int>(members.size())) {
    std::vector<float> v(2, static_cast<float>(rank + 1));
    allreduce(TensorView(v.data(), {2}), "some.grad", {.op = ReduceOp::Sum, .process_set = some});
    CHECK(v[1] == (size >= 3 ? 3.0f : 1.0f));  // 1 + 2, or rank 0's 1 alone.
  }
  remove_process_set(some);
  std::vector<float> last(1, 1.0f);
  allreduce(TensorView(last.data(), {1}), "last", {.op = ReduceOp::Sum});
  CHECK(all_ranks(last[0] == static_cast<float>(size)));
  shutdown();
}

// Every rank submits 'w', then the others 'a', 'b' and the last rank `wrong` instead; each rank
// reports what failed and how long it took.
struct Outcome {
  std::string errors;
  double seconds = 0;
};

Outcome run_diverging(const std::vector<std::string>& wrong) {
  init();
  const bool is_last = world_rank() == world_size() - 1;
  std::vector<float> w(2, 1.0f);
  allreduce(TensorView(w.data(), {2}), "w", {.op = ReduceOp::Sum});
  std::vector<std::vector<float>> data(2, std::vector<float>(2, 1.0f));
  const std::vector<std::string> names = is_last ? wrong : std::vector<std::string>{"a", "b"};
  const auto start = std::chrono::steady_clock::now();
  std::vector<Handle> handles;
  for (std::size_t i = 0; i < names.size(); ++i) {
    handles.push_back(allreduce_async(TensorView(data[i].data(), {2}), names[i]));
  }
  Outcome outcome;
  outcome.errors = failures(handles);
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The runtime has stopped: a new op is refused at once rather than waited for.
  bool refused = false;
  try {
    allreduce(TensorView(w.data(), {2}), "after");
  } catch (const Error&) {
    refused = true;
  }
  CHECK(all_ranks(refused));
  shutdown();
  return outcome;
}

TEST_CASE("a rank that skips an op fails every rank with Mismatch naming both ranks' ops",
          "[desync]") {
  REQUIRE(world_size() >= 2);  // meson.build runs this program with 2 ranks or more.
  const Outcome outcome = run_diverging({"b"});
  const std::string last = std::to_string(world_size() - 1);
  INFO(outcome.errors);
  // Every rank: its pending ops (at or past the divergence) failed with the check's message.
  CHECK(all_ranks(!outcome.errors.empty()));
  CHECK(all_ranks(outcome.errors.find("[not Mismatch]") == std::string::npos));
  CHECK(all_ranks(outcome.errors.find("desync in process set 0 (TUTTI_DEBUG=DETAIL)") !=
                  std::string::npos));
  // Place 1 of set 0 holds 'a' on the others and 'b' on the last rank; both ranks' histories.
  CHECK(all_ranks(outcome.errors.find("seq 1 ALLREDUCE 'a'") != std::string::npos));
  CHECK(all_ranks(outcome.errors.find("seq 1 ALLREDUCE 'b'") != std::string::npos));
  CHECK(all_ranks(outcome.errors.find("rank " + last +
                                      "'s last ops: seq 0 ALLREDUCE 'w', seq 1 "
                                      "ALLREDUCE 'b'") != std::string::npos));
  CHECK(all_ranks(outcome.seconds < desync_bound_seconds()));
  init();  // The next session starts clean.
  std::vector<float> v(2, 1.0f);
  allreduce(TensorView(v.data(), {2}), "again", {.op = ReduceOp::Sum});
  CHECK(all_ranks(v[0] == static_cast<float>(world_size())));
  shutdown();
}

TEST_CASE("a rank that reorders two ops fails every rank with Mismatch", "[desync]") {
  REQUIRE(world_size() >= 2);
  const Outcome outcome = run_diverging({"b", "a"});
  INFO(outcome.errors);
  CHECK(all_ranks(outcome.errors.find("desync in process set 0") != std::string::npos));
  CHECK(all_ranks(outcome.errors.find("[not Mismatch]") == std::string::npos));
  CHECK(all_ranks(outcome.seconds < desync_bound_seconds()));
}

}  // namespace
}  // namespace tutti::test
