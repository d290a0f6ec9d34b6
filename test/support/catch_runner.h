// SPDX-License-Identifier: Apache-2.0
// The one entry into Catch2's session for every test main (unit_main, mpi_catch, gpu_main).
// Catch2 v2 declares Catch::Session only in the file that compiles its implementation, and that
// file is catch_runner.cc alone (why: there).
#pragma once

namespace tutti::test {

// Runs the test cases argc/argv select and returns Catch2's result (the number of failed
// assertions, capped, or non-zero for a bad command line). A non-null report_path sends the
// report to that file, uncoloured, instead of stdout.
int run_catch_session(int argc, char** argv, const char* report_path = nullptr);

}  // namespace tutti::test
