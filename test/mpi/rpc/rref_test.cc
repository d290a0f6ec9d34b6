// SPDX-License-Identifier: Apache-2.0
// RRefs over MPI at 1-4 ranks: forks to third workers, back to the owner and to oneself, forks
// in responses; every owner's live value count returns to zero when the references are gone,
// and at graceful shutdown for those the application still holds (cases shared with the unit
// tier, test/support/rpc_rref_cases.cc); and an owner's count of the values it holds for others.
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "src/rpc/rpc_runtime.h"
#include "test/mpi/rpc/rpc_test_util.h"

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

}  // namespace
}  // namespace tutti::test
