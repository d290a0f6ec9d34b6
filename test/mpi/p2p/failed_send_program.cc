// SPDX-License-Identifier: Apache-2.0
// A send that fails leaves its buffer to the caller (tutti/p2p.h: a send completes when its
// buffer may be reused), so MPI must be done with it once the op fails. A 4 MiB payload goes by
// rendezvous, read from the sender's buffer only when the receiver takes it, which a receiver
// does as its session ends (Note [Sends finished before their buffers are released] in
// ops/mpi/mpi_p2p.cc). The last rank sends to rank 0, which shuts down without receiving (at one
// rank the send to itself stalls instead: run with short stall limits, see meson.build); the
// sender unmaps the buffer as soon as its send ends (it fails, or completes as rank 0's end
// discards the message), so any later read of it faults. Then a second session must work. Its
// own main: tutti::init() starts MPI, as in most programs (the fault did not show where the
// application had started MPI). Exits 0 when every check passed.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "tutti/tutti.h"

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  if (ok) return;
  ++g_failures;
  std::printf("rank %d: FAILED: %s\n", tutti::is_initialized() ? tutti::rank() : -1, what);
  std::fflush(stdout);
}

}  // namespace

int main() {
  tutti::init();
  const int size = tutti::size();
  const int rank = tutti::rank();
  const int sender = size - 1;
  constexpr std::int64_t kFloats = std::int64_t{1} << 20;
  constexpr std::size_t kBytes = kFloats * sizeof(float);
  if (rank == sender) {
    void* mapped =
        mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return 2;
    auto* data = static_cast<float*>(mapped);
    std::fill(data, data + kFloats, 1.0f);
    bool ended = true;  // Completed, or failed for the session's end.
    try {
      tutti::send(tutti::TensorView(data, {kFloats}), 0, 7);  // Rank 0 never receives it.
      // Rank 0's end discarded the message, which finished the send (Note [Settling at the
      // end] in src/core/execution/p2p_engine.h).
    } catch (const tutti::Error& e) {
      ended = e.code() == tutti::ErrorCode::ShutDown || e.code() == tutti::ErrorCode::Stalled;
    }
    check(ended, "the unreceived send completed, or failed with ShutDown or Stalled");
    check(munmap(mapped, kBytes) == 0, "munmap");
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  tutti::shutdown();
  tutti::init();
  std::vector<float> out(4, 7.0f), in(4, 0.0f);
  tutti::Handle sent = tutti::isend(tutti::TensorView(out.data(), {4}), (rank + 1) % size);
  tutti::recv(tutti::TensorView(in.data(), {4}), (rank + size - 1) % size);
  sent.wait();
  check(in[0] == 7.0f, "the next session's ring exchange");
  // Every rank's exchange is over before any shuts down: a rank's shutdown() ends the session's
  // pending ops on the others with ShutDown.
  tutti::barrier();
  tutti::shutdown();
  if (g_failures == 0) std::printf("rank %d: ok\n", rank);
  return g_failures == 0 ? 0 : 1;
}
