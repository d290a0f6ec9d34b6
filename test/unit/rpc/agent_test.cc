// SPDX-License-Identifier: Apache-2.0
// The RPC agent with threads as workers (fake transport): calls to self and others, every error,
// nested calls, many concurrent calls, big messages in pieces, and both shutdowns. The cases are
// shared with the MPI tier (test/support/rpc_agent_cases.cc).
#include <catch2/catch.hpp>

#include "test/unit/rpc/rpc_harness.h"

namespace tutti::test {
namespace {

TEST_CASE("rpc_sync, rpc_async and remote reach every worker, this one included", "[rpc]") {
  const int size = GENERATE(1, 2, 3);
  check_on_threads(size, every_worker_reached());
}

TEST_CASE("Unknown workers and functions, remote exceptions and timeouts fail the call", "[rpc]") {
  check_on_threads(2, failed_calls());
}

TEST_CASE("Nested calls through every worker and back never deadlock, one pool thread each",
          "[rpc]") {
  check_on_threads(3, nested_chains());
}

TEST_CASE("1,000 concurrent rpc_async calls all complete with their own results", "[rpc]") {
  const int size = GENERATE(2, 3);
  check_on_threads(size, concurrent_calls());
}

TEST_CASE("Big messages cross the plane in pieces", "[rpc]") {
  check_on_threads(2, big_messages(1000));
}

TEST_CASE("Graceful shutdown waits for the calls in flight everywhere; later calls fail",
          "[rpc][shutdown]") {
  check_on_threads(3, graceful_shutdown());
}

TEST_CASE("A worker that leaves fails the calls waiting on it with ShutDown", "[rpc][shutdown]") {
  check_on_threads(2, worker_leaves());
}

}  // namespace
}  // namespace tutti::test
