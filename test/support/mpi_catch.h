// SPDX-License-Identifier: Apache-2.0
// The Catch2 run of an MPI test program, shared by its mains (mpi suite, simulated device, gpu):
// every rank runs every test case, and whatever fails on any rank reaches the test's log with
// the rank that failed and why.
//
// Note [Every rank's failures]
// Rank 0 prints its Catch2 report on stdout; a failure that only another rank sees (a check
// that is not collective, an exception, a bound that a loaded rank misses) used to end in
// catch-rank-<r>.log, which nobody read, while rank 0 said "All tests passed" and mpiexec
// named a rank that exited 1. Now each rank r > 0 writes its report to a file of its own and,
// when any of its test cases failed, copies it to stderr with every line prefixed
// "[rank r] "; then rank 0 names every failing rank in one line. What ends a rank outside
// Catch2 (a sanitizer report, std::terminate, Tutti's exit watchdog, an abort) is written to
// stderr by whoever ends it; the mpiexec command of every test tags each line of output with
// the rank that wrote it (Open MPI's --tag-output, MPICH's -prepend-rank: test/meson.build).
#pragma once

namespace tutti::test {

// Runs the Catch2 session configured by the command line on this rank and returns the number
// of failed test cases (or Catch2's error code for a bad command line). Rank 0 reports on
// stdout, the others into a file that agree_on_failures() prints if they failed. Local.
int run_catch(int argc, char** argv);

// Collective over MPI_COMM_WORLD; call once, after run_catch() and whatever other checks the
// program makes (`local_failures` > 0 fails this rank). Prints the report of every rank that
// failed (prefixed "[rank r] "), then, on rank 0, one line naming those ranks. Returns the exit
// code every rank should return: 0 when no rank failed, else 1.
int agree_on_failures(int local_failures);

}  // namespace tutti::test
