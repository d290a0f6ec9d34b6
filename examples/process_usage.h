// SPDX-License-Identifier: Apache-2.0
// What a stretch of a benchmark cost its process besides wall time, per op: context switches
// (voluntary: a thread went to sleep; involuntary: the scheduler took its CPU) and CPU time,
// summed over all the process's threads (getrusage's RUSAGE_SELF on Linux). A hand-off between
// threads that sleeps shows as voluntary switches, two threads spinning as more CPU time than
// wall time. That is the first thing a profile would tell, and the machine lent with the GPU has
// no perf: there P6's latency was 7.00 µs against 1.1-1.6 on the 2-core VMs with the same code
// (README, "What is missed"), and these counts are what its next run can say about why.
// Header-only; usage_by_rank() is collective.
#pragma once

#include <sys/resource.h>

#include <cstdio>
#include <string>
#include <vector>

#include <mpi.h>

namespace tutti::examples {

struct ProcessUsage {
  double voluntary = 0;    // Context switches in which a thread gave its CPU up (slept).
  double involuntary = 0;  // Context switches in which the scheduler took a thread's CPU.
  double cpu_us = 0;       // User and system time, microseconds.
};

// This process's totals so far.
inline ProcessUsage process_usage() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto us = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec);
  };
  return {static_cast<double>(usage.ru_nvcsw), static_cast<double>(usage.ru_nivcsw),
          us(usage.ru_utime) + us(usage.ru_stime)};
}

// What the process spent between `before` and `after`, divided by `ops` (> 0).
inline ProcessUsage per_op(const ProcessUsage& before, const ProcessUsage& after, double ops) {
  return {(after.voluntary - before.voluntary) / ops,
          (after.involuntary - before.involuntary) / ops, (after.cpu_us - before.cpu_us) / ops};
}

// Collective over `comm`. Rank 0 gets each figure with one value per rank, separated by '/':
// "switches_voluntary=0.02/0.01 switches_involuntary=0.00/0.00 cpu_us=2.10/2.05"; the other
// ranks get "".
inline std::string usage_by_rank(const ProcessUsage& usage, MPI_Comm comm) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const double mine[3] = {usage.voluntary, usage.involuntary, usage.cpu_us};
  std::vector<double> all(rank == 0 ? 3 * static_cast<std::size_t>(size) : 0);
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, comm);
  if (rank != 0) return "";
  std::string line;
  const char* names[3] = {"switches_voluntary", "switches_involuntary", "cpu_us"};
  for (int figure = 0; figure < 3; ++figure) {
    line += figure == 0 ? "" : " ";
    line += names[figure];
    line += '=';
    for (int r = 0; r < size; ++r) {
      char value[32];
      std::snprintf(value, sizeof value, "%s%.2f", r == 0 ? "" : "/", all[3 * r + figure]);
      line += value;
    }
  }
  return line;
}

}  // namespace tutti::examples
