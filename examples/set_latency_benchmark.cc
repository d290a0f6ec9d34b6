// SPDX-License-Identifier: Apache-2.0
// The latency of a lone 1-float allreduce on a process set that leaves rank 0 out, each op
// after the job has been idle for a while: the coordinator (rank 0) negotiates the set's ops
// without being a member, and napped until a message could reach it (Note [Doorbell] in
// ops/mpi/doorbell.h). Against the same op on the global set, where rank 0's own submission
// wakes it, and against raw MPI_Allreduce on a communicator of the set's ranks, in the same run.
//
// Usage: mpirun -n N build/examples/set_latency_benchmark [--gap-ms G] [--iterations K]
//   N >= 3 (the set is ranks 1 .. N-1); each op comes G ms (default 50) after the ranks last met;
//   K ops of each kind (default 30).
// Ends with: P2-set ranks=<N> gap_ms=<G> set_us=<median> global_us=<median> raw_us=<median>
// (rank 1's clock).
#include <tutti/process_set.h>
#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "examples/machine_line.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples.empty() ? 0 : samples[samples.size() / 2];
}

// `iterations` times: the ranks meet, wait `gap`, then the members run `op`; its time in
// microseconds on this rank (empty on ranks that are not members).
template <class Op>
std::vector<double> after_gaps(int iterations, std::chrono::milliseconds gap, bool member, Op op) {
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    std::this_thread::sleep_for(gap);
    if (!member) continue;
    const Clock::time_point start = Clock::now();
    op();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int gap_ms = 50;
  int iterations = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    // A whole number, or -1: "5x" or a missing value is refused, not read as 5 or 0.
    char* end = nullptr;
    const long parsed = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : -1;
    const int value = end != nullptr && end != argv[i + 1] && *end == '\0' && parsed <= 1'000'000
                          ? static_cast<int>(parsed)
                          : -1;
    if ((arg != "--gap-ms" && arg != "--iterations") || value < (arg == "--gap-ms" ? 0 : 1)) {
      std::fprintf(stderr,
                   "set_latency_benchmark: bad argument '%s'\n"
                   "usage: mpirun -n N set_latency_benchmark [--gap-ms G] [--iterations K]\n",
                   arg.c_str());
      return 2;
    }
    (arg == "--gap-ms" ? gap_ms : iterations) = value;
    ++i;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  tutti::init();
  const std::string machine = tutti::examples::machine_line();
  const int rank = tutti::rank();
  const int size = tutti::size();
  if (rank == 0) std::printf("%s\n", machine.c_str());
  if (size < 3) {
    if (rank == 0) std::fprintf(stderr, "set_latency_benchmark needs at least 3 ranks\n");
    tutti::shutdown();
    MPI_Finalize();
    return 1;
  }
  std::vector<int> members;
  for (int r = 1; r < size; ++r) members.push_back(r);
  tutti::ProcessSet set = tutti::add_process_set(members);
  MPI_Comm raw_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, rank, &raw_comm);
  const bool member = rank != 0;
  const std::chrono::milliseconds gap(gap_ms);
  float value = 1.0f;
  const std::vector<double> on_set = after_gaps(iterations, gap, member, [&] {
    tutti::allreduce(tutti::TensorView(&value, {1}), "set_latency.set",
                     {.op = tutti::ReduceOp::Sum, .process_set = set});
  });
  const std::vector<double> global = after_gaps(iterations, gap, true, [&] {
    tutti::allreduce(tutti::TensorView(&value, {1}), "set_latency.global",
                     {.op = tutti::ReduceOp::Sum});
  });
  const std::vector<double> raw = after_gaps(iterations, gap, member, [&] {
    MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_FLOAT, MPI_SUM, raw_comm);
  });
  if (rank == 1) {
    std::printf("P2-set ranks=%d gap_ms=%d set_us=%.1f global_us=%.1f raw_us=%.1f\n", size, gap_ms,
                median(on_set), median(global), median(raw));
  }
  if (raw_comm != MPI_COMM_NULL) MPI_Comm_free(&raw_comm);
  tutti::remove_process_set(set);
  tutti::shutdown();
  MPI_Finalize();
  return 0;
}
