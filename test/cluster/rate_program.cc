// SPDX-License-Identifier: Apache-2.0
// Usage: rate_program BYTES
// For the test of scripts/netns_cluster --rate (2 ranks, one a host): rank 0 sends BYTES to
// rank 1, then rank 1 sends BYTES to rank 0, each timed by its sender until a 1-byte reply
// says the last byte arrived; rank 0 prints "rate_program: bytes=B to1_s=S to0_s=S". Plain
// MPI: what is measured is the link, not Tutti.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <mpi.h>

namespace {

// Seconds from `sender` sending `data` to `receiver` until the receiver's reply arrives (on
// the sender; 0 elsewhere).
double timed_send(std::vector<char>& data, int sender, int receiver, int rank) {
  char reply = 0;
  const int count = static_cast<int>(data.size());
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  if (rank == sender) {
    MPI_Send(data.data(), count, MPI_CHAR, receiver, 0, MPI_COMM_WORLD);
    MPI_Recv(&reply, 1, MPI_CHAR, receiver, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return MPI_Wtime() - start;
  }
  if (rank == receiver) {
    MPI_Recv(data.data(), count, MPI_CHAR, sender, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(&reply, 1, MPI_CHAR, sender, 1, MPI_COMM_WORLD);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long bytes = argc > 1 ? std::atol(argv[1]) : 0;
  if (size != 2 || bytes < 1 || bytes > (1L << 30)) {
    if (rank == 0) std::fprintf(stderr, "rate_program: usage: 2 ranks, BYTES in 1 .. 2^30\n");
    MPI_Finalize();
    return 2;
  }
  std::vector<char> data(static_cast<std::size_t>(bytes), 1);
  std::vector<char> tiny(1, 1);
  timed_send(tiny, 0, 1, rank);  // Connections up both ways before anything is timed.
  timed_send(tiny, 1, 0, rank);
  const double to1 = timed_send(data, 0, 1, rank);
  double to0 = timed_send(data, 1, 0, rank);
  if (rank == 1) MPI_Send(&to0, 1, MPI_DOUBLE, 0, 2, MPI_COMM_WORLD);
  if (rank == 0) {
    MPI_Recv(&to0, 1, MPI_DOUBLE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    std::printf("rate_program: bytes=%ld to1_s=%.4f to0_s=%.4f\n", bytes, to1, to0);
  }
  MPI_Finalize();
  return 0;
}
