// SPDX-License-Identifier: Apache-2.0
// Threads that wait on collectives run the loop's cycle themselves where they may (Note [A
// waiting thread runs the cycle] in src/core/loop_driver.h): several at once, beside the
// communication thread, with ops of every size waited for in and out of order; a thread left
// waiting when the session ends gets ShutDown. Values are closed forms of rank, thread and
// round. At 1 and 2 ranks on this project's machines the cycle is driven; at 3 and 4 (more
// ranks than cores) the same test checks the communication thread alone.
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/error_of.h"
#include "test/support/mpi_test_util.h"
#include "test/support/thread_rounds.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

constexpr int kThreads = 4;
constexpr int kRounds = 120;

TEST_CASE("threads that wait run the cycle together, beside the communication thread",
          "[threads]") {
  Session session;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &wrong] {
      wrong[static_cast<std::size_t>(t)] =
          run_thread_rounds(world_rank(), world_size(), t, kRounds);
    });
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
