// SPDX-License-Identifier: Apache-2.0
// The first line of a benchmark's output (DESIGN.md §6): the CPU model, the MPI library and
// version, and each rank's CPU binding, so that figures from different machines are never
// compared unawares. Header-only; collective (every rank calls it; every rank gets the line).
#pragma once

#include <sched.h>
#include <tutti/tutti.h>

#include <fstream>
#include <string>
#include <vector>

#include <mpi.h>

namespace tutti::examples {

namespace detail {

// lscpu's model name (the first "model name" of /proc/cpuinfo).
inline std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// The MPI library's version string, its first line up to the first comma.
inline std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string mpi(version, static_cast<std::size_t>(length));
  return mpi.substr(0, mpi.find_first_of(",\n"));
}

// The CPUs this thread may run on, "0,1,...".
inline std::string own_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    }
  }
  return cpus;
}

inline std::string line_of(const std::vector<std::string>& cpus_by_rank) {
  std::string binding;
  for (std::size_t r = 0; r < cpus_by_rank.size(); ++r) {
    binding += (r ? ";" : "") + std::to_string(r) + ":" + cpus_by_rank[r];
  }
  return "cpu=" + cpu_model() + " mpi=" + mpi_library() +
         " ranks=" + std::to_string(cpus_by_rank.size()) + " binding=" + binding;
}

}  // namespace detail

// "cpu=<lscpu model name> mpi=<library version, first line> ranks=<n> binding=<r>:<cpus>;..."
// Collective over Tutti's global set (tutti::init() first).
inline std::string machine_line() {
  return detail::line_of(allgather_object(detail::own_cpus(), "machine_line.binding"));
}

// The same over MPI_COMM_WORLD, for a program that runs MPI itself (MPI initialized, no Tutti
// session needed).
inline std::string machine_line_mpi() {
  const std::string mine = detail::own_cpus();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> offsets(static_cast<std::size_t>(size), 0);
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(offsets.back() + lengths.back()), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                 MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> cpus;
  for (int r = 0; r < size; ++r) cpus.push_back(all.substr(offsets[r], lengths[r]));
  return detail::line_of(cpus);
}

}  // namespace tutti::examples
