// SPDX-License-Identifier: Apache-2.0
// Catch2 main of the unit suite: one process, no MPI.
#include "test/support/catch_runner.h"

int main(int argc, char** argv) { return tutti::test::run_catch_session(argc, argv); }
