// SPDX-License-Identifier: Apache-2.0
// Usage: rpc_peer_death_program   (under Open MPI's mpirun --enable-recovery, 3 ranks)
// A worker dies in the middle of serving calls: rank 2 kills itself (SIGKILL) 300 ms after every
// rank started, while rank 0 waits in rpc_sync() to it and rank 1 in to_here() of an RRef that
// rank 2 owns, each with a 2 s timeout against a function that would sleep 10 s. Each survivor
// prints "rank R: <ErrorCode> after S s: <message>" (or "rank R: no error after S s") and
// leaves at once with _exit(0): with a peer dead, neither RPC's graceful shutdown nor
// MPI_Finalize can complete. test/debug/rpc_peer_death_test.py checks the lines.
#include <signal.h>
#include <tutti/rpc.h>
#include <tutti/tutti.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

int main() {
  using tutti::rpc::Message;
  tutti::rpc::register_function("sleep", [](const Message& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(m.bytes)));
    return m;
  });
  tutti::init();
  const int rank = tutti::rank();
  tutti::rpc::init_rpc("w" + std::to_string(rank));
  tutti::barrier();
  if (rank == 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    raise(SIGKILL);
  }
  const Message ten_seconds{.tensors = {}, .rrefs = {}, .bytes = "10000"};
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  try {
    if (rank == 0) {
      tutti::rpc::rpc_sync("w2", "sleep", ten_seconds, 2.0);
    } else {
      tutti::rpc::remote("w2", "sleep", ten_seconds, 2.0).to_here(30.0);
    }
    std::printf("rank %d: no error after %.2f s\n", rank, seconds());
  } catch (const tutti::Error& e) {
    std::printf("rank %d: %s after %.2f s: %s\n", rank,
                std::string(tutti::to_string(e.code())).c_str(), seconds(), e.what());
  }
  std::fflush(stdout);
  _exit(0);
}
