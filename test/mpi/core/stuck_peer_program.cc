// SPDX-License-Identifier: Apache-2.0
// A job with one live-but-stuck rank after an error (run by stuck_peer_test.py): the last rank
// never submits and then sleeps far longer than any test waits, outside Tutti; the others get
// Stalled and return from main, so their exit reaches MPI_Finalize while the stuck rank
// neither exits nor progresses. TUTTI_EXIT_GRACE_SECONDS must end the job.
#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>
#include <vector>

#include "tutti/tutti.h"

int main() {
  tutti::init();
  std::vector<float> v(4, 1.0f);
  if (tutti::rank() == tutti::size() - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 0;
  }
  try {
    tutti::allreduce(tutti::TensorView(v.data(), {4}), "never.matched");
  } catch (const tutti::Error& e) {
    const std::string_view code = tutti::to_string(e.code());
    std::printf("rank %d: %.*s: %s\n", tutti::rank(), static_cast<int>(code.size()), code.data(),
                e.what());
  }
  return 0;  // No shutdown(): exit shuts Tutti down, then MPI_Finalize waits for the stuck rank.
}
