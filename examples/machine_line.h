// SPDX-License-Identifier: Apache-2.0
// The first line of a benchmark's output (DESIGN.md §6): the CPU model, the MPI library and
// version, and each rank's CPU binding, so that figures from different machines are never
// compared unawares. Header-only; collective (every rank calls it; every rank gets the line).
//
// A VM's model name can be generic: this project's AMD VMs of family 25 model 17 and of family
// 26 model 2, two CPU generations, both say "AMD EPYC". So the line also gives /proc/cpuinfo's
// family and model numbers, and the size of CPU 0's L2 (where a step's working set spills).
#pragma once

#include <sched.h>
#include <tutti/tutti.h>

#include <fstream>
#include <string>
#include <vector>

#include <mpi.h>

namespace tutti::examples {

namespace detail {

// /proc/cpuinfo's first value of `key` (the whole key: "model" is not "model name"), or "?".
inline std::string cpuinfo_value(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::size_t end = line.find_last_not_of(" \t", colon - 1);
    if (end != std::string::npos && line.compare(0, end + 1, key) == 0 && end + 1 == key.size()) {
      const std::size_t value = line.find_first_not_of(" \t", colon + 1);
      return value == std::string::npos ? "?" : line.substr(value);
    }
  }
  return "?";
}

// lscpu's model name (the first "model name" of /proc/cpuinfo).
inline std::string cpu_model() {
  const std::string model = cpuinfo_value("model name");
  return model == "?" ? "unknown" : model;
}

// The size of CPU 0's level-2 cache as sysfs gives it ("1024K"), or "?".
inline std::string l2_size() {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level");
    std::string level, size;
    if (!(level_file >> level)) break;
    if (level != "2") continue;
    std::ifstream size_file(dir + "/size");
    if (size_file >> size) return size;
  }
  return "?";
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

inline std::string line_of(const std::vector<std::string>& cpus_by_rank, const std::string& mpi) {
  std::string binding;
  for (std::size_t r = 0; r < cpus_by_rank.size(); ++r) {
    binding += (r ? ";" : "") + std::to_string(r) + ":" + cpus_by_rank[r];
  }
  return "cpu=" + cpu_model() + " cpu_family=" + cpuinfo_value("cpu family") +
         " cpu_model=" + cpuinfo_value("model") + " l2=" + l2_size() + " mpi=" + mpi +
         " ranks=" + std::to_string(cpus_by_rank.size()) + " binding=" + binding;
}

}  // namespace detail

// "cpu=<lscpu model name> cpu_family=<f> cpu_model=<m> l2=<CPU 0's L2> mpi=<library version,
// first line> ranks=<n> binding=<r>:<cpus>;..."
// Collective over Tutti's global set (tutti::init() first).
inline std::string machine_line() {
  return detail::line_of(allgather_object(detail::own_cpus(), "machine_line.binding"),
                         detail::mpi_library());
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
  return detail::line_of(cpus, detail::mpi_library());
}

// The same for a program of one process that uses no MPI (a device-only benchmark): "mpi=none
// ranks=1", its own binding. Not collective.
inline std::string machine_line_alone() { return detail::line_of({detail::own_cpus()}, "none"); }

}  // namespace tutti::examples
