// SPDX-License-Identifier: Apache-2.0
// The stall inspector: ops some ranks never submit fail with Stalled on every rank, naming
// the missing ranks and tensors, within twice the configured limit. Run with
// TUTTI_STALL_CHECK_TIME_SECONDS=1 and TUTTI_STALL_SHUTDOWN_TIME_SECONDS=2 (see meson.build).
#include <chrono>
#include <string>
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

}  // namespace
}  // namespace tutti::test
