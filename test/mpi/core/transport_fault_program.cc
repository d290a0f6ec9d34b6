// SPDX-License-Identifier: Apache-2.0
// One rank's transport fails inside an allreduce (injected, run by job_end_test.py): the other
// ranks are then blocked in MPI_Allreduce for a collective the failed rank never enters, where
// no message reaches them. The failed rank stays alive (it sleeps far longer than any test
// waits), so only Tutti's bound can end the job.
#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>
#include <vector>

#include "ops/fault_injection.h"
#include "tutti/tutti.h"

int main() {
  tutti::init();
  const bool faulty = tutti::rank() == tutti::size() - 1;
  if (faulty) tutti::ops::inject_allreduce_fault(1);
  // Large enough to skip the fusion buffer's path entirely; the fault is in the backend call.
  std::vector<float> v(1 << 16, 1.0f);
  try {
    tutti::allreduce(tutti::TensorView(v.data(), {1 << 16}), "faulty.allreduce");
    std::printf("rank %d: allreduce returned\n", tutti::rank());
  } catch (const tutti::Error& e) {
    const std::string_view code = tutti::to_string(e.code());
    std::printf("rank %d: %.*s: %s\n", tutti::rank(), static_cast<int>(code.size()), code.data(),
                e.what());
  }
  std::fflush(stdout);
  if (faulty) std::this_thread::sleep_for(std::chrono::seconds(600));
  return 0;
}
