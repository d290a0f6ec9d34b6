// SPDX-License-Identifier: Apache-2.0
// An unmatched receive is watched like a collective: Stalled within twice the configured
// limit (times time_scale(): Note [Time bounds in tests] in test/support/mpi_test_util.h) on
// the waiting rank, and the runtime stops (the other ranks' ops then fail with
// ShutDown, or Stalled if theirs stalled too). Run with TUTTI_STALL_CHECK_TIME_SECONDS=1 and
// TUTTI_STALL_SHUTDOWN_TIME_SECONDS=2, and also with the shutdown limit (1.5 s) far below the
// check time (30 s), which must not delay it (see meson.build).
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// TUTTI_STALL_SHUTDOWN_TIME_SECONDS as meson.build sets it.
double shutdown_limit_seconds() {
  const char* value = std::getenv("TUTTI_STALL_SHUTDOWN_TIME_SECONDS");
  REQUIRE(value != nullptr);
  return std::stod(value);
}

TEST_CASE("an unmatched receive fails with Stalled within twice the limit", "[p2p][stall]") {
  init();
  const int size = world_size();
  std::vector<float> v(4, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  ErrorCode code = ErrorCode::Internal;
  std::string message;
  // Rank 0 waits for a message from the last rank that never comes; the others wait for a
  // message from rank 0 with a tag nobody sends.
  const int peer = world_rank() == 0 ? size - 1 : 0;
  try {
    recv(TensorView(v.data(), {4}), peer, world_rank() == 0 ? 5 : 6);
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(message << " after " << seconds << " s");
  CHECK(all_ranks(code == ErrorCode::Stalled || code == ErrorCode::ShutDown));
  CHECK(all_ranks(world_rank() != 0 || code == ErrorCode::Stalled || size > 1));
  if (code == ErrorCode::Stalled) {
    CHECK(message.find("rank " + std::to_string(peer)) != std::string::npos);
    CHECK(message.find("tag") != std::string::npos);
  }
  CHECK(all_ranks(seconds < 2 * shutdown_limit_seconds() * time_scale()));
  // The runtime has stopped: new ops fail with ShutDown, not a hang.
  bool refused = false;
  try {
    isend(TensorView(v.data(), {4}), world_rank());
  } catch (const Error& e) {
    refused = e.code() == ErrorCode::ShutDown;
  }
  CHECK(all_ranks(refused));
  shutdown();
  init();  // And it starts again.
  std::vector<float> w(4, 7.0f);
  Handle s = isend(TensorView(w.data(), {4}), (world_rank() + 1) % size);
  recv(TensorView(v.data(), {4}), (world_rank() + size - 1) % size);
  s.wait();
  CHECK(all_ranks(v[0] == 7.0f));
  shutdown();
}

}  // namespace
}  // namespace tutti::test
