// SPDX-License-Identifier: Apache-2.0
// See Note [Every rank's failures] in test/support/mpi_catch.h.
#include "test/support/mpi_catch.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <mpi.h>

#include "test/support/catch_runner.h"

namespace tutti::test {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// The report of rank > 0: one file per process, so that two test programs run from the same
// folder never read each other's reports.
std::string report_path(int rank) {
  return "catch-rank-" + std::to_string(rank) + "-" + std::to_string(::getpid()) + ".log";
}

// This rank's report (rank > 0) on stderr, each line prefixed with the rank, in one write so
// that it is not interleaved with another rank's lines.
void print_report(int rank, int local_failures) {
  std::ostringstream text;
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  text << prefix << "this rank failed (" << local_failures << "); its report:\n";
  std::ifstream in(report_path(rank));
  std::string line;
  bool any = false;
  while (std::getline(in, line)) {
    text << prefix << line << '\n';
    any = true;
  }
  if (!any) text << prefix << "(no Catch2 report: the failure is in the lines above)\n";
  const std::string bytes = text.str();
  std::fwrite(bytes.data(), 1, bytes.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

int run_catch(int argc, char** argv) {
  const int rank = world_rank();
  if (rank == 0) return run_catch_session(argc, argv);
  const std::string report = report_path(rank);
  return run_catch_session(argc, argv, report.c_str());
}

int agree_on_failures(int local_failures) {
  const int rank = world_rank();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> failures(static_cast<std::size_t>(size), 0);
  MPI_Allgather(&local_failures, 1, MPI_INT, failures.data(), 1, MPI_INT, MPI_COMM_WORLD);
  if (rank != 0) {
    if (local_failures != 0) print_report(rank, local_failures);
    std::remove(report_path(rank).c_str());
  }
  std::string failing;
  for (int r = 0; r < size; ++r) {
    if (failures[static_cast<std::size_t>(r)] != 0)
      failing += (failing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (failing.empty()) return 0;
  if (rank == 0) {
    // After the reports: every rank has printed before it reaches the barrier.
    MPI_Barrier(MPI_COMM_WORLD);
    std::fprintf(stderr,
                 "mpi test: FAILED on rank(s) %s of %d (rank 0's report is on stdout, "
                 "the others' in their \"[rank r]\" lines)\n",
                 failing.c_str(), size);
    std::fflush(stderr);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
  }
  return 1;
}

}  // namespace tutti::test
