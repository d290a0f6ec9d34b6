// SPDX-License-Identifier: Apache-2.0
// Catch2 main of the unit suite: one process, no MPI.
#define CATCH_CONFIG_MAIN  // NOLINT(readability-identifier-naming)
#include <catch2/catch.hpp>
