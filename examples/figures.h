// SPDX-License-Identifier: Apache-2.0
// What the benchmarks make their figures with: elapsed time, the slowest rank's value, the median
// (one home: allreduce_benchmark's files share a unity translation unit).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include <mpi.h>

namespace tutti::examples {

// Milliseconds since `start` on the steady clock.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// The slowest rank's `value` decides a figure: the max over MPI_COMM_WORLD. Collective.
inline double max_over_ranks(double value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return value;
}

// The middle value of `values` (the upper one of an even count). `values` must not be empty.
inline double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace tutti::examples
