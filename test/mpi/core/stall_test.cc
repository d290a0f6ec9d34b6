// SPDX-License-Identifier: Apache-2.0
// The stall inspector: ops some ranks never submit fail with Stalled on every rank, naming
// the missing ranks and tensors, within twice the configured limit. Run with
// TUTTI_STALL_CHECK_TIME_SECONDS=1 and TUTTI_STALL_SHUTDOWN_TIME_SECONDS=2 (see meson.build).
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

TEST_CASE("every rank gets Stalled naming the missing ranks within twice the limit", "[stall]") {
  init();
  const int size = world_size();
  const int last = size - 1;
  std::vector<float> v(4, 1.0f);
  // The last rank never submits "everyone.but.last"; only it submits "only.last". Every rank
  // then waits on an op that can never be matched.
  const bool is_last = world_rank() == last;
  const auto start = std::chrono::steady_clock::now();
  ErrorCode code = ErrorCode::Internal;
  std::string message;
  bool threw = false;
  try {
    allreduce(TensorView(v.data(), {4}), is_last ? "only.last" : "everyone.but.last");
  } catch (const Error& e) {
    threw = true;
    code = e.code();
    message = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (size == 1) {
    CHECK_FALSE(threw);  // Alone, nothing can stall.
  } else {
    INFO(message);
    CHECK(all_ranks(threw && code == ErrorCode::Stalled));
    CHECK(all_ranks(message.find("rank " + std::to_string(last) + ": everyone.but.last") !=
                    std::string::npos));
    CHECK(all_ranks(message.find("only.last") != std::string::npos));
    CHECK(all_ranks(message.find("Stalled: Stalled") == std::string::npos));
    CHECK(all_ranks(seconds < 2 * 2.0));
    // The runtime has stopped: new ops fail with ShutDown, not a hang.
    bool refused = false;
    try {
      allreduce(TensorView(v.data(), {4}), "after.stall");
    } catch (const Error& e) {
      refused = e.code() == ErrorCode::ShutDown;
    }
    CHECK(all_ranks(refused));
  }
  shutdown();
  init();  // And it starts again.
  allreduce(TensorView(v.data(), {4}), "again", {.op = ReduceOp::Sum});
  CHECK(all_ranks(v[0] == (size == 1 ? 1.0f : static_cast<float>(size))));
  shutdown();
}

TEST_CASE("a join the others never reach stalls like any op, naming them", "[stall]") {
  // Before, a join on one rank waited forever with no warning while the others were stuck.
  init();
  const int size = world_size();
  if (size > 1) {
    ErrorCode code = ErrorCode::Internal;
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    if (world_rank() == 0) {
      try {
        join();
      } catch (const Error& e) {
        code = e.code();
        message = e.what();
      }
    } else {
      // Stuck outside Tutti for longer than the stall limit, then joins too late.
      std::this_thread::sleep_for(std::chrono::seconds(5));
      try {
        join();
      } catch (const Error& e) {
        code = e.code();
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(message);
    CHECK(all_ranks(code == ErrorCode::Stalled ||
                    (world_rank() != 0 && code == ErrorCode::ShutDown)));
    if (world_rank() == 0) {
      CHECK(seconds < 2 * 2.0);
      for (int r = 1; r < size; ++r)
        CHECK(message.find("rank " + std::to_string(r) + ": tutti.join") != std::string::npos);
    }
  }
  shutdown();
}

TEST_CASE("a joined rank waiting while the others still train is not stalled", "[stall]") {
  // Rank 0 joins at once; the others allreduce for longer than the stall shutdown time.
  init();
  const int size = world_size();
  std::vector<float> v(4, 1.0f);
  int last_joined = -1;
  if (world_rank() != 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3500);
    while (std::chrono::steady_clock::now() < until) {
      std::fill(v.begin(), v.end(), 1.0f);
      allreduce(TensorView(v.data(), {4}), "train", {.op = ReduceOp::Sum});
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  CHECK_NOTHROW(last_joined = join());
  // Rank 0 joined first and contributed zeros: the others summed size - 1 ones.
  if (world_rank() != 0) CHECK(v[0] == static_cast<float>(size - 1));
  CHECK(all_ranks(last_joined >= 0 && last_joined < size));
  shutdown();
}

}  // namespace
}  // namespace tutti::test
