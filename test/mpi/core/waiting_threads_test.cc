// SPDX-License-Identifier: Apache-2.0
// Threads that wait on collectives run the loop's cycle themselves where they may (Note [A
// waiting thread runs the cycle] in src/core/loop_driver.h): several at once, beside the
// communication thread, with ops of every size waited for in and out of order; a thread left
// waiting when the session ends gets ShutDown. Values are closed forms of rank, thread and
// round. At 1 and 2 ranks on this project's machines the cycle is driven; at 3 and 4 (more
// ranks than cores) the same test checks the communication thread alone.
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

constexpr int kThreads = 4;
constexpr int kRounds = 120;

// Small integers, exact in float: what `rank` contributes to element `i` of thread `t`'s op in
// round `round`.
float term(int rank, int t, int round, std::int64_t i) {
  return static_cast<float>(rank + 1 + t + round + static_cast<int>(i % 3));
}

// The allreduce sum of term() over the ranks.
float sum(int t, int round, std::int64_t i) {
  const int size = world_size();
  return static_cast<float>(size * (size + 1) / 2 + size * (t + round + static_cast<int>(i % 3)));
}

// Sizes from one float to past the default fusion threshold's pieces.
std::int64_t elements(int round) {
  constexpr std::int64_t kSizes[] = {1, 7, 1000, 70000};
  return kSizes[round % 4];
}

// Thread `t`'s rounds: a blocking allreduce; every third round two async allreduces waited for
// in reverse order; every fifth an allgather. Returns the number of wrong elements.
int run_rounds(int t) {
  int wrong = 0;
  const std::string name = "t" + std::to_string(t);
  for (int round = 0; round < kRounds; ++round) {
    const std::int64_t n = elements(round);
    std::vector<float> a(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      a[static_cast<std::size_t>(i)] = term(world_rank(), t, round, i);
    if (round % 3 == 0) {
      std::vector<float> b = a;
      Handle first = allreduce_async(TensorView(a.data(), {n}), name + ".a", {.op = ReduceOp::Sum});
      Handle second =
          allreduce_async(TensorView(b.data(), {n}), name + ".b", {.op = ReduceOp::Sum});
      second.wait();
      first.wait();
      for (std::int64_t i = 0; i < n; ++i)
        wrong += b[static_cast<std::size_t>(i)] != sum(t, round, i);
    } else {
      allreduce(TensorView(a.data(), {n}), name, {.op = ReduceOp::Sum});
    }
    for (std::int64_t i = 0; i < n; ++i)
      wrong += a[static_cast<std::size_t>(i)] != sum(t, round, i);
    if (round % 5 == 0) {
      float mine = static_cast<float>(world_rank() * 10 + t);
      const Tensor all = allgather(TensorView(&mine, {1}), name + ".g");
      const auto* got = static_cast<const float*>(all.data());
      for (int r = 0; r < world_size(); ++r) wrong += got[r] != static_cast<float>(r * 10 + t);
    }
  }
  return wrong;
}

TEST_CASE("threads that wait run the cycle together, beside the communication thread",
          "[threads]") {
  Session session;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &wrong] { wrong[static_cast<std::size_t>(t)] = run_rounds(t); });
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) CHECK(all_ranks(wrong[static_cast<std::size_t>(t)] == 0));
}

TEST_CASE("a thread still waiting when the session ends gets ShutDown", "[threads]") {
  init();
  std::vector<float> v(3, 1.0f);
  std::optional<ErrorCode> got;
  std::thread waiter;
  // Only the last rank submits: nobody else ever will, so its waiter drives, then sleeps,
  // until shutdown fails the op.
  const bool lonely = world_size() > 1 && world_rank() == world_size() - 1;
  if (lonely) {
    Handle h = allreduce_async(TensorView(v.data(), {3}), "lonely");
    waiter = std::thread([h, &got]() mutable { got = error_of([&] { h.wait(); }); });
  }
  MPI_Barrier(MPI_COMM_WORLD);
  shutdown();
  if (waiter.joinable()) waiter.join();
  CHECK(all_ranks(!lonely || got == ErrorCode::ShutDown));
}

}  // namespace
}  // namespace tutti::test
