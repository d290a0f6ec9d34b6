// SPDX-License-Identifier: Apache-2.0
// A test program of the mpi suite's own harness (test/support/mpi_catch.h): one rank fails on
// purpose, in the way HARNESS_FAILURE names, and harness_test.py checks that the log says which
// rank failed and why. Without HARNESS_FAILURE every rank passes.
//   check  a check that fails on the last rank only (not collective, on purpose)
//   throw  an exception escapes a test case on rank 1
//   abort  the last rank aborts mid-test (as a sanitizer report or a failed TUTTI_CHECK would)
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"

namespace tutti::test {
namespace {

std::string failure_mode() {
  const char* mode = std::getenv("HARNESS_FAILURE");
  return mode == nullptr ? "" : mode;
}

TEST_CASE("a collective every rank agrees on", "[harness]") {
  int sum = 1;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(all_ranks(sum == world_size()));
}

TEST_CASE("one rank fails on purpose", "[harness]") {
  const std::string mode = failure_mode();
  const int last = world_size() - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (mode == "check") {
    CHECK(world_rank() != last);  // Deliberately not collective: only the last rank fails.
  } else if (mode == "throw" && world_rank() == 1) {
    throw std::runtime_error("deliberate failure on rank 1");
  } else if (mode == "abort" && world_rank() == last) {
    std::fprintf(stderr, "deliberate abort on the last rank\n");
    std::fflush(stderr);
    std::abort();
  }
}

TEST_CASE("the ranks still meet after a local failure", "[harness]") {
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(all_ranks(true));
}

}  // namespace
}  // namespace tutti::test
