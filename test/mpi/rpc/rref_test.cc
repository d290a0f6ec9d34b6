// SPDX-License-Identifier: Apache-2.0
// RRefs over MPI at 1-4 ranks: forks to third workers, back to the owner and to oneself, forks
// in responses; every owner's live value count returns to zero when the references are gone,
// and at graceful shutdown for those the application still holds (cases shared with the unit
// tier, test/support/rpc_rref_cases.cc); and an owner's count of the values it holds for others.
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/rpc/rpc_runtime.h"
#include "src/rpc/rref_context.h"
#include "test/mpi/rpc/rpc_test_util.h"
#include "test/support/error_of.h"

namespace tutti::test {
namespace {

TEST_CASE("Owners free their values once every reference anywhere is gone, under many forks",
          "[rpc][rref]") {
  check_on_ranks(rrefs_freed_under_forks());
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
  check_on_ranks(shutdown_releases_rrefs());
}

TEST_CASE("to_here(t) ends within t when remote() took most of it and the fetch is slow",
          "[rpc][rref]") {
  // remote()'s function on worker 1 sleeps 0.6 t; then this worker's RPC thread is held for
  // 0.7 t (a callback of remote()'s future runs there, at once after the answer), so the fetch
  // cannot end before 1.3 t: it stands in for a big value or a loaded machine, but surely. One
  // deadline gives Timeout at t; before, the fetch got all of t again and returned the value
  // at 1.3 t (it could take up to 1.6 t). The bound below leaves 0.6 t for a loaded machine.
  constexpr double kTimeout = 2.0;
  std::string problem;
  RpcGroup group;
  if (world_size() > 1 && world_rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    rpc::RRef ref = rpc::remote(worker(1), "sleep", bytes_only("1200"));
    rpc::detail::RRefAccess::impl(ref)->user->creation->then(
        [](const auto&) { std::this_thread::sleep_for(std::chrono::milliseconds(1400)); });
    std::string message;
    const auto code = error_of([&] { static_cast<void>(ref.to_here(kTimeout)); }, &message);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (code != ErrorCode::Timeout) {
      problem = "to_here() did not throw Timeout: " + message;
    } else if (took >= 1.6 * kTimeout) {
      problem = "to_here() took " + std::to_string(took) + " s";
    } else if (message.find("RRef::to_here()") == std::string::npos ||
               message.find("'w1'") == std::string::npos ||
               message.find("within 2 s") == std::string::npos ||
               message.find("tutti.rref.fetch") != std::string::npos) {
      problem = "the Timeout should name to_here(), its owner and its timeout: " + message;
    }
  }
  INFO(problem);
  CHECK(all_ranks(problem.empty()));
}

}  // namespace
}  // namespace tutti::test
