// SPDX-License-Identifier: Apache-2.0
// Usage: start_timeout_program tutti|app LATE_SECONDS
// Rank 1 reaches tutti::init() LATE_SECONDS after the others. "tutti": init() starts MPI;
// "app": the program starts MPI itself first, so only tutti::init() is late. Each rank prints
// "rank R: init ok" or "rank R: init failed: CODE: message" (then exits 3); start_timeout_test.py
// judges the job.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <mpi.h>

#include "tutti/tutti.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: start_timeout_program tutti|app LATE_SECONDS\n");
    return 2;
  }
  const std::string mode = argv[1];
  const double late_s = std::atof(argv[2]);
  if (mode == "app") {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  // Before MPI starts only the launcher knows the rank.
  const char* launcher_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (launcher_rank == nullptr) launcher_rank = std::getenv("PMI_RANK");
  const int rank = launcher_rank != nullptr ? std::atoi(launcher_rank) : 0;
  if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(late_s));
  try {
    tutti::init();
  } catch (const tutti::Error& e) {
    const std::string code(tutti::to_string(e.code()));
    std::printf("rank %d: init failed: %s: %s\n", rank, code.c_str(), e.what());
    std::fflush(stdout);
    return 3;
  }
  std::printf("rank %d: init ok\n", rank);
  tutti::shutdown();
  return 0;
}
