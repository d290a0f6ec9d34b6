// SPDX-License-Identifier: Apache-2.0
// Main of the mpi suite's Catch2 programs. The test owns MPI (so Tutti's shutdown() leaves it
// up, as API.md promises); every rank runs every test case, a failure on any rank reaches the
// log with its rank (Note [Every rank's failures] in test/support/mpi_catch.h), and every rank
// exits with the same code.
#include <mpi.h>

#include "test/support/mpi_catch.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, 1);  // Oracles run beside Tutti.
  const int code = tutti::test::agree_on_failures(tutti::test::run_catch(argc, argv));
  MPI_Finalize();
  return code;
}
