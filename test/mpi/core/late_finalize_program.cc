// SPDX-License-Identifier: Apache-2.0
// After an ordinary shutdown() on every rank, the last rank calls MPI_Finalize later than the
// exit grace while the others already wait in theirs: no error stopped the runtime, so the exit
// watchdog must stay disarmed (issue 29: every shutdown counted as an error and armed it, and the
// communicators were left to MPI_Finalize). Run with TUTTI_EXIT_GRACE_SECONDS=1 (meson.build);
// exits 0 unless aborted.
#include <chrono>
#include <thread>
#include <vector>

#include <mpi.h>

#include "tutti/tutti.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  tutti::init();
  std::vector<float> v(4, 1.0f);
  tutti::allreduce(tutti::TensorView(v.data(), {4}), "before.shutdown");
  const bool last = tutti::rank() == tutti::size() - 1;
  tutti::shutdown();
  if (last) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  MPI_Finalize();  // The others wait here for the last rank.
  return 0;
}
