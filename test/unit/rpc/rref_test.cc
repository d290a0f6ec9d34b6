// SPDX-License-Identifier: Apache-2.0
// RRef lifetimes with threads as workers: forks to third workers, back to the owner and to
// oneself; the owner's live value count returns to zero once every reference is gone, and at
// graceful shutdown for references the application still holds.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "test/support/error_of.h"
#include "test/unit/rpc/rpc_harness.h"

namespace tutti::test {
namespace {

using rpc::Message;
using Outcome = std::vector<std::string>;

void expect(Outcome& out, bool ok, const std::string& what) {
  if (!ok) out.push_back(what);
}

int owned_on(const std::string& worker_name) {
  return std::stoi(rpc::rpc_sync(worker_name, "owned_count").bytes);
}

// Polls until the owner's count is `expected` (deletes are asynchronous); returns the last count.
int wait_for_owned(const std::string& worker_name, int expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int count = owned_on(worker_name);
  while (count != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    count = owned_on(worker_name);
  }
  return count;
}

TEST_CASE("An owner frees its values once every reference anywhere is gone, under many forks",
          "[rpc][rref]") {
  constexpr int kRefs = 25;
  Outcome outcome;
  int during = -1, after = -1;
  Group group(3);
  group.run([&](int rank) {
    if (rank != 0) return;  // w1 owns, w2 is the third worker; both only serve.
    std::vector<rpc::RRef> refs, returned;
    for (int i = 0; i < kRefs; ++i) {
      refs.push_back(rpc::remote("w1", "echo",
                                 {.tensors = {nn::Variable(filled({4}, float(i)))},
                                  .rrefs = {},
                                  .bytes = std::to_string(i)}));
    }
    for (int i = 0; i < kRefs; ++i) {
      const Message one{.tensors = {}, .rrefs = {refs[static_cast<std::size_t>(i)]}, .bytes = {}};
      const std::string want = std::to_string(i);
      // A fork to a third worker, which fetches from the owner.
      Message a = rpc::rpc_sync("w2", "fetch", one);
      expect(
          outcome,
          a.bytes == want && values_of(a.tensors.at(0).value()) == values_of(filled({4}, float(i))),
          "third worker fetch " + want);
      // Back to its owner: the owner's own value.
      Message b = rpc::rpc_sync("w1", "owner_value", one);
      expect(outcome,
             b.bytes == "owner" &&
                 values_of(b.tensors.at(0).value()) == values_of(filled({4}, float(i))),
             "owner value " + want);
      // The third worker passes it on to the owner; and a fork to oneself.
      Message c =
          rpc::rpc_sync("w2", "forward_fetch", {.tensors = {}, .rrefs = one.rrefs, .bytes = "w1"});
      expect(outcome, c.bytes == want, "forwarded to the owner " + want);
      Message d = rpc::rpc_sync("w0", "fetch", one);
      expect(outcome, d.bytes == want, "fork to self " + want);
      // Forks coming back in a response, twice in one message.
      Message e =
          rpc::rpc_sync("w2", "return_rrefs",
                        {.tensors = {}, .rrefs = {one.rrefs[0], one.rrefs[0]}, .bytes = {}});
      expect(outcome,
             e.rrefs.size() == 2 && !e.rrefs[0].is_owner() && e.rrefs[1].owner().name == "w1" &&
                 e.rrefs[1].to_here().bytes == want,
             "returned forks " + want);
      for (rpc::RRef& r : e.rrefs) returned.push_back(r);
    }
    // An RRef its owner made and returned: a fork from the owner.
    Message made =
        rpc::rpc_sync("w1", "make_local_rref", {.tensors = {}, .rrefs = {}, .bytes = "local"});
    rpc::RRef from_owner = made.rrefs.at(0);
    expect(outcome, from_owner.to_here().bytes == "local" && from_owner.confirmed_by_owner(),
           "owner's fork");
    during = owned_on("w1");
    refs.clear();
    returned.clear();
    from_owner = rpc::RRef();
    made = Message{};
    after = wait_for_owned("w1", 0);
  });
  CHECK(outcome == Outcome{});
  CHECK(during == kRefs + 1);
  CHECK(after == 0);
}

TEST_CASE("Graceful shutdown releases the RRefs the application still holds", "[rpc][rref]") {
  std::vector<rpc::RRef> kept;
  std::optional<ErrorCode> after_shutdown;
  {
    Group group(3);
    group.run([&](int rank) {
      if (rank != 0) return;
      for (int i = 0; i < 10; ++i) kept.push_back(rpc::remote(worker(1 + i % 2), "echo"));
      kept.push_back(
          rpc::rpc_sync("w2", "return_rrefs", {.tensors = {}, .rrefs = {kept[0]}, .bytes = {}})
              .rrefs.at(0));
    });
    CHECK(group.agent(1).rrefs().owned_count() == 0);
    CHECK(group.agent(2).rrefs().owned_count() == 0);
    after_shutdown = error_of([&] { kept[0].to_here(); });
  }
  CHECK(after_shutdown == ErrorCode::ShutDown);
}

TEST_CASE("remote() to oneself keeps the value while its handle or a fork lives", "[rpc][rref]") {
  Outcome outcome;
  int after = -1;
  Group group(2);
  group.run([&](int rank) {
    if (rank != 0) return;
    rpc::RRef mine = rpc::remote("w0", "echo", {.tensors = {}, .rrefs = {}, .bytes = "self"});
    expect(outcome,
           mine.is_owner() && mine.local_value().bytes == "self" && mine.to_here().bytes == "self",
           "own value");
    // Dropped at once: the value is made anyway and then freed.
    static_cast<void>(rpc::remote("w0", "sleep", {.tensors = {}, .rrefs = {}, .bytes = "20"}));
    Message fetched = rpc::rpc_sync("w1", "fetch", {.tensors = {}, .rrefs = {mine}, .bytes = {}});
    expect(outcome, fetched.bytes == "self", "fetched by a user");
    mine = rpc::RRef();
    after = wait_for_owned("w0", 0);
  });
  CHECK(outcome == Outcome{});
  CHECK(after == 0);
}

}  // namespace
}  // namespace tutti::test
