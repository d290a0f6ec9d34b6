// SPDX-License-Identifier: Apache-2.0
// The RPC agent with threads as workers (fake transport): calls to self and others, every error,
// nested calls, many concurrent calls, big messages in pieces, and both shutdowns. The cases are
// shared with the MPI tier (test/support/rpc_agent_cases.cc).
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/rpc/rpc_harness.h"

namespace tutti::test {
namespace {

// Each case runs with the RPC thread alone serving the calls, and with callers of rpc_sync()
// running its pass while they wait (Note [A waiting caller runs the pass] in
// src/rpc/agent_drive.cc).
TEST_CASE("rpc_sync, rpc_async and remote reach every worker, this one included", "[rpc]") {
  const int size = GENERATE(1, 2, 3);
  const bool drive = GENERATE(false, true);
  check_on_threads(size, every_worker_reached(), drive);
}

TEST_CASE("Unknown workers and functions, remote exceptions and timeouts fail the call", "[rpc]") {
  check_on_threads(2, failed_calls(), GENERATE(false, true));
}

TEST_CASE("Nested calls through every worker and back never deadlock, one pool thread each",
          "[rpc]") {
  check_on_threads(3, nested_chains(), GENERATE(false, true));
}

TEST_CASE("1,000 concurrent rpc_async calls all complete with their own results", "[rpc]") {
  const int size = GENERATE(2, 3);
  check_on_threads(size, concurrent_calls(), GENERATE(false, true));
}

TEST_CASE("rpc_sync from four threads of every worker at once: each call its own result", "[rpc]") {
  const int size = GENERATE(1, 2, 3);
  const bool drive = GENERATE(false, true);
  check_on_threads(size, concurrent_sync_calls(), drive);
}

TEST_CASE("A caller waiting in rpc_sync runs the RPC thread's pass only where callers drive",
          "[rpc]") {
  const bool drive = GENERATE(false, true);
  Group group(2, {}, drive);
  std::vector<int> right(2, 0);
  group.run([&](int rank) {
    for (int i = 0; i < 100; ++i) {
      const std::string tag = std::to_string(rank) + "/" + std::to_string(i);
      right[static_cast<std::size_t>(rank)] +=
          rpc::rpc_sync(worker(1 - rank), "echo", {.tensors = {}, .rrefs = {}, .bytes = tag})
              .bytes == tag;
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("worker " << rank << ", callers drive: " << drive);
    CHECK(right[static_cast<std::size_t>(rank)] == 100);
    // The callers ran passes while they waited (how many depends on the RPC thread's timing:
    // a pass it holds makes the caller yield instead), and none where callers do not drive.
    if (drive) {
      CHECK(group.agent(rank).driven_passes() > 0);
    } else {
      CHECK(group.agent(rank).driven_passes() == 0);
    }
  }
}

TEST_CASE("Big messages cross the plane in pieces", "[rpc]") {
  check_on_threads(2, big_messages(1000), GENERATE(false, true));
}

TEST_CASE("Graceful shutdown waits for the calls in flight everywhere; later calls fail",
          "[rpc][shutdown]") {
  check_on_threads(3, graceful_shutdown(), GENERATE(false, true));
}

TEST_CASE("A worker that leaves fails the calls waiting on it with ShutDown", "[rpc][shutdown]") {
  check_on_threads(2, worker_leaves(), GENERATE(false, true));
}

}  // namespace
}  // namespace tutti::test
