// SPDX-License-Identifier: Apache-2.0
// Usage: bell_program OPS GAP_MS
// OPS lone 1-float allreduces (Sum) on the process set of every rank but 0, each GAP_MS after
// the ranks last met, so that the coordinator (rank 0, not a member) naps when each comes:
// the case its net bell is for (Note [Net bell] in ops/mpi/net_bell.h). Checks each result
// against its closed form (the sum of the members' ranks) and prints, on rank 1, the median
// latency. Exits 1 on a wrong result. Whether the bell rang is in rank 0's INFO line at
// shutdown, which test/cluster/cluster_test.py (case bell) reads.
#include <tutti/process_set.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>
#include <vector>

#include <mpi.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bell_program OPS GAP_MS\n");
    return 2;
  }
  const int ops = std::atoi(argv[1]);
  const std::chrono::milliseconds gap(std::atoi(argv[2]));
  tutti::init();
  const int rank = tutti::rank();
  const int size = tutti::size();
  std::vector<int> members(static_cast<std::size_t>(size - 1));
  std::iota(members.begin(), members.end(), 1);
  tutti::ProcessSet set = tutti::add_process_set(members);
  // 1 + 2 + ... + (size - 1).
  const float expected = static_cast<float>(size * (size - 1) / 2);
  std::vector<double> latency_us;
  int wrong = 0;
  for (int i = 0; i < ops; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    std::this_thread::sleep_for(gap);
    if (rank == 0) continue;
    float value = static_cast<float>(rank);
    const auto start = std::chrono::steady_clock::now();
    tutti::allreduce(tutti::TensorView(&value, {1}), "bell",
                     {.op = tutti::ReduceOp::Sum, .process_set = set});
    latency_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
    if (value != expected) {
      std::fprintf(stderr, "rank %d, op %d: %g, expected %g\n", rank, i, value, expected);
      ++wrong;
    }
  }
  if (rank == 1) {
    std::sort(latency_us.begin(), latency_us.end());
    std::printf("set without rank 0, %d ops %lld ms apart: median %.0f us\n", ops,
                static_cast<long long>(gap.count()), latency_us[latency_us.size() / 2]);
  }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  tutti::remove_process_set(set);
  tutti::shutdown();
  return wrong == 0 ? 0 : 1;
}
