// SPDX-License-Identifier: Apache-2.0
// This file includes <mpi.h> although it is outside ops/: a failed check must reach MPI_Abort
// without depending on an upper layer (STYLE.md 2.1).
#include "src/common/check.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <mpi.h>

#include "src/common/logging.h"

namespace tutti::detail {

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  log_message(LogLevel::Fatal,
              str_cat(file, ":", line, ": check failed: ", condition, ": ", message));
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    // The launcher kills every rank once told of the abort; the pause lets it forward the
    // message first (MPICH's could drop it).
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    MPI_Abort(MPI_COMM_WORLD, 134);
  }
  std::abort();
}

}  // namespace tutti::detail
