// SPDX-License-Identifier: Apache-2.0
#include "examples/p3_recorder.h"

#include <tutti/tutti.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include "examples/figures.h"
#include "examples/p3_workload.h"

namespace tutti::examples {
namespace {

constexpr const char* kSize = "TUTTI_FLIGHT_RECORDER_SIZE";

// Sets kSize to `value`, or unsets it for nullopt.
void set_size(const std::optional<std::string>& value) {
  if (value) {
    setenv(kSize, value->c_str(), 1);
  } else {
    unsetenv(kSize);
  }
}

// P3 in a session of its own with kSize at `size`: the median of `steps` after two warm-up
// steps, which fill the response cache.
double session_median_ms(P3Workload& p3, const std::optional<std::string>& size, int steps) {
  set_size(size);
  tutti::init();
  std::vector<double> ms;
  for (int s = 0; s < steps + 2; ++s) {
    const double took = p3.tutti_step_ms();
    if (s >= 2) ms.push_back(took);
  }
  tutti::shutdown();
  return median_of(ms);
}

// Whether `value` is the number 0, which turns the recorder off.
bool turns_off(const std::string& value) {
  char* end = nullptr;
  const long long number = std::strtoll(value.c_str(), &end, 10);
  return end != value.c_str() && *end == '\0' && number == 0;
}

}  // namespace

int run_p3_recorder(int rounds, int steps) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* given = std::getenv(kSize);
  const std::optional<std::string> on = given ? std::optional<std::string>(given) : std::nullopt;
  // Every rank sees the same environment under mpirun, so every rank refuses alike.
  if (on && turns_off(*on)) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "allreduce_benchmark --recorder compares the flight recorder on against off; "
                   "%s=%s turns it off, which leaves nothing to compare\n",
                   kSize, on->c_str());
    }
    return 2;
  }
  const std::optional<std::string> off = std::string("0");
  P3Workload p3;
  std::vector<double> on_ms, off_ms, raw_ms, on_over_off, on_over_raw, off_over_raw;
  for (int round = 0; round < rounds; ++round) {
    double with = 0;
    double without = 0;
    if (round % 2 == 0) {
      with = session_median_ms(p3, on, steps);
      without = session_median_ms(p3, off, steps);
    } else {
      without = session_median_ms(p3, off, steps);
      with = session_median_ms(p3, on, steps);
    }
    std::vector<double> raw;
    for (int s = 0; s < steps + 1; ++s) {
      const double took = p3.raw_step_ms();
      if (s >= 1) raw.push_back(took);
    }
    const double raw_median = median_of(raw);
    on_ms.push_back(with);
    off_ms.push_back(without);
    raw_ms.push_back(raw_median);
    on_over_off.push_back(with / without);
    on_over_raw.push_back(with / raw_median);
    off_over_raw.push_back(without / raw_median);
    if (rank == 0) {
      std::printf("P3-recorder round=%d on_ms=%.3f off_ms=%.3f raw_ms=%.3f\n", round, with, without,
                  raw_median);
      std::fflush(stdout);
    }
  }
  set_size(on);
  if (p3.wrong()) {
    if (rank == 0) std::fprintf(stderr, "P3-recorder: a step left a sum other than %d\n", size);
    return 1;
  }
  if (rank == 0) {
    std::printf(
        "P3-recorder rounds=%d steps=%d on_ms=%.3f off_ms=%.3f raw_ms=%.3f on_over_off=%.3f "
        "on_over_raw=%.3f off_over_raw=%.3f\n",
        rounds, steps, median_of(on_ms), median_of(off_ms), median_of(raw_ms),
        median_of(on_over_off), median_of(on_over_raw), median_of(off_over_raw));
  }
  return 0;
}

}  // namespace tutti::examples
