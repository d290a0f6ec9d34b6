// SPDX-License-Identifier: Apache-2.0
// RRef lifetimes with threads as workers: forks to third workers, back to the owner and to
// oneself; the owner's live value count returns to zero once every reference is gone, and at
// graceful shutdown for references the application still holds (cases shared with the MPI tier,
// test/support/rpc_rref_cases.cc); and remote() to oneself.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "test/unit/rpc/rpc_harness.h"

namespace tutti::test {
namespace {

using rpc::Message;

TEST_CASE("Owners free their values once every reference anywhere is gone, under many forks",
          "[rpc][rref]") {
  check_on_threads(3, rrefs_freed_under_forks());
}

TEST_CASE("Graceful shutdown releases the RRefs the application still holds", "[rpc][rref]") {
  check_on_threads(3, shutdown_releases_rrefs());
}

// Polls until worker 0 owns no value (deletes are asynchronous); returns the last count.
int wait_until_none_owned() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int count = rpc::detail::owned_rref_count_for_testing();
  while (count != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    count = rpc::detail::owned_rref_count_for_testing();
  }
  return count;
}

TEST_CASE("remote() to oneself keeps the value while its handle or a fork lives", "[rpc][rref]") {
  std::vector<std::string> outcome;
  int after = -1;
  Group group(2);
  group.run([&](int rank) {
    if (rank != 0) return;
    rpc::RRef mine = rpc::remote("w0", "echo", {.tensors = {}, .rrefs = {}, .bytes = "self"});
    if (!(mine.is_owner() && mine.local_value().bytes == "self" && mine.to_here().bytes == "self"))
      outcome.push_back("own value");
    // Dropped at once: the value is made anyway and then freed.
    static_cast<void>(rpc::remote("w0", "sleep", {.tensors = {}, .rrefs = {}, .bytes = "20"}));
    Message fetched = rpc::rpc_sync("w1", "fetch", {.tensors = {}, .rrefs = {mine}, .bytes = {}});
    if (fetched.bytes != "self") outcome.push_back("fetched by a user");
    mine = rpc::RRef();
    after = wait_until_none_owned();
  });
  CHECK(outcome == std::vector<std::string>{});
  CHECK(after == 0);
}

}  // namespace
}  // namespace tutti::test
