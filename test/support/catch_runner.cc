// SPDX-License-Identifier: Apache-2.0
// Catch2's implementation, in the one translation unit every test program links (through
// unit_main, mpi_catch or gpu_main, which call run_catch_session). Catch2 v2 is a single header:
// the file that defines CATCH_CONFIG_RUNNER compiles all of Catch2, the slowest file of a
// sanitized build (52 s under ASan + UBSan at -O1 on a 2-core AMD EPYC, 9 s at -O0 without).
// test/support/meson.build compiles it once, unsanitized and unoptimized (why: there).
#define CATCH_CONFIG_RUNNER  // NOLINT(readability-identifier-naming)
#include "test/support/catch_runner.h"

#include <catch2/catch.hpp>

namespace tutti::test {

int run_catch_session(int argc, char** argv, const char* report_path) {
  Catch::Session session;
  const int failed = session.applyCommandLine(argc, argv);
  if (failed != 0) return failed;
  if (report_path != nullptr) {
    session.configData().outputFilename = report_path;
    session.configData().useColour = Catch::UseColour::No;  // Its lines go into a file.
  }
  return session.run();
}

}  // namespace tutti::test
