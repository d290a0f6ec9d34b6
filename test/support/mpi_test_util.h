// SPDX-License-Identifier: Apache-2.0
// Helpers for MPI tests.
//
// Note [Collective assertions]
// Every rank runs every TEST_CASE in order, and an assertion after a collective must agree on
// all ranks, or the failing ones skip the next collective and the rest hang in it. So assert
// all_ranks(local_ok) (an MPI_LAND allreduce); fixed GENERATE values are fine, rank-dependent
// SECTIONs are not.
#pragma once

#include <cstdlib>
#include <string>

#include <mpi.h>

#include "tutti/tutti.h"

namespace tutti::test {

// tutti::init() for the lifetime of a test case's scope.
struct Session {
  Session() { tutti::init(); }
  ~Session() { tutti::shutdown(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// True on every rank iff `ok` is true on every rank. Collective over MPI_COMM_WORLD.
inline bool all_ranks(bool ok) {
  int value = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return value != 0;
}

// Note [Time bounds in tests]
// A reliability test bounds how long a failure takes to surface (a stall, an exit watchdog):
// "within twice the limit", say. A rank under a sanitizer on a loaded 2-core machine runs
// several times slower, so such a bound is multiplied by this factor: the environment's
// TEST_TIME_SCALE (scripts/test sets it for the sanitizer builds), 1 when unset or malformed.
// Where the order of events says the same as a bound, tests assert the order instead.
inline double time_scale() {
  const char* text = std::getenv("TEST_TIME_SCALE");
  if (text == nullptr) return 1.0;
  char* end = nullptr;
  const double scale = std::strtod(text, &end);
  return end != text && *end == '\0' && scale >= 1.0 ? scale : 1.0;
}

// Sets the stall inspector's limits short for the next init(), which reads them (alike on every
// rank); ShortStallSession unsets them once init() has.
struct ShortStallLimits {
  ShortStallLimits() {
    ::setenv("TUTTI_STALL_CHECK_TIME_SECONDS", "2", 1);
    ::setenv("TUTTI_STALL_SHUTDOWN_TIME_SECONDS", std::to_string(10 * time_scale()).c_str(), 1);
  }
};

// A Session whose stall inspector fails a stalled op within seconds instead of minutes: for tests
// of what used to stall, so that the old behaviour ends in a Stalled error, not a long wait.
struct ShortStallSession : ShortStallLimits, Session {
  ShortStallSession() {
    ::unsetenv("TUTTI_STALL_CHECK_TIME_SECONDS");
    ::unsetenv("TUTTI_STALL_SHUTDOWN_TIME_SECONDS");
  }
};

}  // namespace tutti::test
