// SPDX-License-Identifier: Apache-2.0
// The first line of a benchmark's output (DESIGN.md §6): the CPU model, the MPI library and
// version, and each rank's CPU binding, so that figures from different machines are never
// compared unawares. Header-only; collective (every rank calls it, rank 0 gets the line).
#pragma once

#include <sched.h>
#include <tutti/tutti.h>

#include <fstream>
#include <string>
#include <vector>

#include <mpi.h>

namespace tutti::examples {

// "cpu=<lscpu model name> mpi=<library version, first line> ranks=<n> binding=<r>:<cpus>;..."
inline std::string machine_line() {
  std::string model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string mpi(version, static_cast<std::size_t>(length));
  mpi = mpi.substr(0, mpi.find_first_of(",\n"));
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    }
  }
  const std::vector<std::string> all = allgather_object(cpus, "machine_line.binding");
  std::string binding;
  for (std::size_t r = 0; r < all.size(); ++r) {
    binding += (r ? ";" : "") + std::to_string(r) + ":" + all[r];
  }
  return "cpu=" + model + " mpi=" + mpi + " ranks=" + std::to_string(size()) +
         " binding=" + binding;
}

}  // namespace tutti::examples
