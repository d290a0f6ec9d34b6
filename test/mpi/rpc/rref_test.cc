// SPDX-License-Identifier: Apache-2.0
// RRefs over MPI at 1-4 ranks: forks to third workers, back to the owner and to oneself, forks
// in responses; every owner's live value count returns to zero when the references are gone,
// and at graceful shutdown for those the application still holds.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/rpc/rpc_runtime.h"
#include "test/mpi/rpc/rpc_test_util.h"
#include "test/support/error_of.h"

namespace tutti::test {
namespace {

using rpc::Message;

int owned_on(const std::string& name) {
  return std::stoi(rpc::rpc_sync(name, "owned_count").bytes);
}

TEST_CASE("Owners free their values once every reference anywhere is gone, under many forks",
          "[rpc][rref]") {
  constexpr int kRefs = 20;
  RpcGroup group;
  Problems p;
  // Every rank plays creator at once: values on the next worker, forks through the one after.
  const std::string owner = peer(1), third = peer(2);
  {
    std::vector<rpc::RRef> refs, returned;
    for (int i = 0; i < kRefs; ++i) {
      refs.push_back(rpc::remote(owner, "echo",
                                 {.tensors = {nn::Variable(filled({4}, float(i)))},
                                  .rrefs = {},
                                  .bytes = std::to_string(i)}));
    }
    for (int i = 0; i < kRefs; ++i) {
      const std::vector<rpc::RRef> one = {refs[static_cast<std::size_t>(i)]};
      const std::string want = std::to_string(i);
      p.expect(
          rpc::rpc_sync(third, "fetch", {.tensors = {}, .rrefs = one, .bytes = {}}).bytes == want,
          "third " + want);
      Message back =
          rpc::rpc_sync(owner, "owner_value", {.tensors = {}, .rrefs = one, .bytes = {}});
      p.expect(back.bytes == "owner" &&
                   values_of(back.tensors.at(0).value()) == values_of(filled({4}, float(i))),
               "owner " + want);
      p.expect(rpc::rpc_sync(third, "forward_fetch", {.tensors = {}, .rrefs = one, .bytes = owner})
                       .bytes == want,
               "forwarded " + want);
      p.expect(
          rpc::rpc_sync(worker(world_rank()), "fetch", {.tensors = {}, .rrefs = one, .bytes = {}})
                  .bytes == want,
          "self " + want);
      Message e = rpc::rpc_sync(third, "return_rrefs",
                                {.tensors = {}, .rrefs = {one[0], one[0]}, .bytes = {}});
      p.expect(e.rrefs.size() == 2 && e.rrefs[1].to_here().bytes == want, "returned " + want);
      for (rpc::RRef& r : e.rrefs) returned.push_back(r);
    }
    Message made =
        rpc::rpc_sync(owner, "make_local_rref", {.tensors = {}, .rrefs = {}, .bytes = "local"});
    p.expect(made.rrefs.at(0).to_here().bytes == "local", "owner's fork");
  }  // Every handle of this rank is gone.
  // Each owner holds only what its creator (the previous rank) made; wait until all creators
  // have dropped theirs, then until the deletes have arrived.
  MPI_Barrier(MPI_COMM_WORLD);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int count = owned_on(owner);
  while (count != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    count = owned_on(owner);
  }
  INFO(p.text() << " count " << count);
  CHECK(all_ranks(p.ok() && count == 0));
}

TEST_CASE("An owner counts the values it holds for others", "[rpc][rref]") {
  RpcGroup group;
  std::vector<rpc::RRef> refs;
  for (int i = 0; i < 7; ++i) refs.push_back(rpc::remote(peer(1), "echo"));
  for (const rpc::RRef& r : refs) static_cast<void>(r.to_here());
  MPI_Barrier(MPI_COMM_WORLD);  // Every rank's values exist on its next rank.
  const int mine = rpc::detail::owned_rref_count_for_testing();
  MPI_Barrier(MPI_COMM_WORLD);  // Nobody drops its RRefs before every count is taken.
  CHECK(all_ranks(mine == 7));
}

TEST_CASE("Graceful shutdown releases the RRefs the application still holds", "[rpc][rref]") {
  std::vector<rpc::RRef> kept;
  tutti::init();
  register_test_functions();
  rpc::init_rpc(worker(world_rank()));
  // On the other workers only (one rank: on itself).
  const int others = std::max(1, world_size() - 1);
  for (int i = 0; i < 10; ++i) kept.push_back(rpc::remote(peer(1 + i % others), "echo"));
  kept.push_back(
      rpc::rpc_sync(peer(2), "return_rrefs", {.tensors = {}, .rrefs = {kept[0]}, .bytes = {}})
          .rrefs.at(0));
  std::shared_ptr<rpc::detail::Agent> agent = rpc::detail::current_agent().value_or_throw();
  rpc::shutdown();
  // Values owned here for others are freed (a one-rank job owns its ten itself, and the handles
  // in `kept` still hold them).
  const int left = agent->rrefs().owned_count();
  const auto after = error_of([&] { kept.back().to_here(); });
  agent.reset();
  tutti::shutdown();
  const int expected = world_size() == 1 ? 10 : 0;
  INFO("owned values left " << left);
  CHECK(all_ranks(left == expected));
  CHECK(all_ranks(after == ErrorCode::ShutDown));
}

}  // namespace
}  // namespace tutti::test
