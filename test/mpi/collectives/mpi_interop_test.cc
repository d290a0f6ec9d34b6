// SPDX-License-Identifier: Apache-2.0
// tutti::init(MPI_Comm): Tutti over a duplicate of world, over world in reversed order, and
// over the even and odd halves of world (one Tutti per process, two independent groups);
// rank(), size() and every collective are relative to the given communicator.
#include "tutti/mpi_interop.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/mpi/collectives/collective_util.h"

namespace tutti::test {
namespace {

// Checks rank/size and an allgather/allreduce/broadcast over the communicator Tutti runs on,
// whose rank of this process is `expected_rank` among `expected_size`.
bool check_session(MPI_Comm comm, int expected_rank, int expected_size, std::string* failure) {
  tutti::init(comm);
  bool ok = rank() == expected_rank && size() == expected_size &&
            ProcessSet::global().size() == expected_size;
  if (!ok) *failure = "rank " + std::to_string(rank()) + " size " + std::to_string(size());
  // Tutti ranks order the allgather: element i is the world rank of Tutti rank i.
  std::int32_t mine = world_rank();
  const Tensor all = allgather(TensorView(&mine, {1}), "world.ranks");
  std::vector<std::int32_t> expected(static_cast<std::size_t>(expected_size));
  MPI_Allgather(&mine, 1, MPI_INT32_T, expected.data(), 1, MPI_INT32_T, comm);  // The oracle.
  const auto got = all.span<std::int32_t>();
  ok = ok && std::vector<std::int32_t>(got.begin(), got.end()) == expected;
  if (!ok && failure->empty()) *failure = "allgather order";
  std::int32_t sum = 1;
  allreduce(TensorView(&sum, {1}), "count", {.op = ReduceOp::Sum});
  std::int32_t root_value = rank() == 0 ? world_rank() : -1;
  broadcast(TensorView(&root_value, {1}), 0, "root");
  ok = ok && sum == expected_size && root_value == expected[0];
  if (!ok && failure->empty()) *failure = "allreduce or broadcast";
  tutti::shutdown();
  return ok;
}

TEST_CASE("init over a duplicate of world", "[mpi_interop]") {
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &copy);
  std::string failure;
  const bool ok = check_session(copy, world_rank(), world_size(), &failure);
  INFO(failure);
  CHECK(all_ranks(ok));
  MPI_Comm_free(&copy);
}

TEST_CASE("init over world in reversed order: ranks are relative to the communicator",
          "[mpi_interop]") {
  MPI_Comm reversed = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, world_size() - 1 - world_rank(), &reversed);
  std::string failure;
  const bool ok = check_session(reversed, world_size() - 1 - world_rank(), world_size(), &failure);
  INFO(failure);
  CHECK(all_ranks(ok));
  MPI_Comm_free(&reversed);
}

TEST_CASE("init over the even and odd halves: two independent Tutti groups", "[mpi_interop]") {
  SubComm half(world_rank() % 2);
  const int half_size = (world_size() + 1 - world_rank() % 2) / 2;
  std::string failure;
  const bool ok = check_session(half.comm, world_rank() / 2, half_size, &failure);
  INFO(failure);
  CHECK(all_ranks(ok));
}

TEST_CASE("init(MPI_Comm) reports a malformed setting like init()", "[mpi_interop]") {
  setenv("TUTTI_CACHE_CAPACITY", "many", 1);
  std::string message;
  CHECK(error_of([] { tutti::init(MPI_COMM_WORLD); }, &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("TUTTI_CACHE_CAPACITY") != std::string::npos);
  unsetenv("TUTTI_CACHE_CAPACITY");
  CHECK_FALSE(is_initialized());
}

// A rank that an MPI_Comm_split left out holds MPI_COMM_NULL: refused by the call, nothing
// started (before, the first collective on it ended the whole job through MPI's fatal error
// handler).
TEST_CASE("init(MPI_COMM_NULL) is InvalidArgument, and Tutti starts afterwards", "[mpi_interop]") {
  std::string message;
  CHECK(error_of([] { tutti::init(MPI_COMM_NULL); }, &message) == ErrorCode::InvalidArgument);
  CHECK(message.find("MPI_COMM_NULL") != std::string::npos);
  CHECK_FALSE(is_initialized());
  tutti::init(MPI_COMM_WORLD);
  CHECK(all_ranks(tutti::size() == world_size()));
  tutti::shutdown();
}

}  // namespace
}  // namespace tutti::test
