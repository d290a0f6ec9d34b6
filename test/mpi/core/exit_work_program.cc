// SPDX-License-Identifier: Apache-2.0
// After an error stopped the runtime, the application finalizes MPI itself and its process then
// spends longer than TUTTI_EXIT_GRACE_SECONDS exiting (as LeakSanitizer's scan does on a loaded
// machine): the exit watchdog must not take that for a finalize stuck on a peer. Run on 2 ranks
// with TUTTI_EXIT_GRACE_SECONDS=1 and 1 s stall limits (meson.build); exits 0 unless aborted.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "tutti/tutti.h"

namespace {

// Registered before MPI and Tutti, so it runs after every exit handler they register.
void slow_exit() { std::this_thread::sleep_for(std::chrono::milliseconds(2500)); }

}  // namespace

int main(int argc, char** argv) {
  std::atexit(slow_exit);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  tutti::init();
  std::vector<float> v(4, 1.0f);
  try {
    // Every rank submits a name no other rank does: Stalled everywhere, the runtime stops.
    tutti::allreduce(tutti::TensorView(v.data(), {4}),
                     "only.rank." + std::to_string(tutti::rank()));
  } catch (const tutti::Error& e) {
    std::printf("rank %d: %s\n", tutti::rank(), e.what());
  }
  tutti::shutdown();
  MPI_Finalize();
  return 0;
}
