// SPDX-License-Identifier: Apache-2.0
// Catch2 main of the mpi suite. The test owns MPI (so Tutti's shutdown() leaves it up, as
// API.md promises); rank 0 prints the report, the others write catch-rank-<r>.log, and every
// rank exits with the same code.
#define CATCH_CONFIG_RUNNER  // NOLINT(readability-identifier-naming)
#include <string>

#include <catch2/catch.hpp>
#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, 1);  // Oracles run beside Tutti.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int failed = session.applyCommandLine(argc, argv);
  if (failed == 0) {
    if (rank != 0)
      session.configData().outputFilename = "catch-rank-" + std::to_string(rank) + ".log";
    failed = session.run();
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
