// SPDX-License-Identifier: Apache-2.0
#include "examples/p1_stores.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <mpi.h>

#include "examples/figures.h"

namespace tutti::examples {
namespace {

using Clock = std::chrono::steady_clock;

// P1 in the current session: the median of `steps` steps after one warm-up step.
double p1_median_ms(const std::vector<tutti::TensorView>& views, int steps) {
  std::vector<double> ms;
  std::vector<tutti::Handle> handles(views.size());
  for (int s = 0; s < steps + 1; ++s) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    for (std::size_t i = 0; i < views.size(); ++i) {
      handles[i] = tutti::allreduce_async(views[i], "grad." + std::to_string(i));
    }
    for (tutti::Handle& h : handles) h.wait();
    const double took = max_over_ranks(ms_since(start));
    if (s > 0) ms.push_back(took);
  }
  return median_of(ms);
}

}  // namespace

double peer_roundtrip_ns() {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int host_rank = 0;
  MPI_Comm_rank(host, &host_rank);
  // Ranks 0 and 1 of the job share a host iff they are ranks 0 and 1 of rank 0's host.
  int pair = (rank == 0 && host_rank == 0) || (rank == 1 && host_rank == 1) ? 1 : 0;
  int pairs = 0;
  MPI_Allreduce(&pair, &pairs, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  double result = -1;
  if (size > 1 && pairs == 2) {
    // One line for the flag, allocated by host rank 0; the other ranks of the host add none.
    MPI_Win window = MPI_WIN_NULL;
    void* base = nullptr;
    MPI_Win_allocate_shared(host_rank == 0 ? 64 : 0, 64, MPI_INFO_NULL, host, &base, &window);
    MPI_Aint bytes = 0;
    int unit = 0;
    void* line = nullptr;
    MPI_Win_shared_query(window, 0, &bytes, &unit, &line);
    auto* flag = static_cast<std::atomic<std::int64_t>*>(line);
    if (host_rank == 0) flag->store(0);
    MPI_Barrier(MPI_COMM_WORLD);
    constexpr int kTrips = 20000;
    if (rank <= 1) {
      // Rank 0 writes odd values, rank 1 answers with the next even one.
      const Clock::time_point start = Clock::now();
      for (std::int64_t i = 0; i < kTrips; ++i) {
        if (rank == 0) {
          flag->store(2 * i + 1, std::memory_order_release);
          while (flag->load(std::memory_order_acquire) != 2 * i + 2) {
          }
        } else {
          while (flag->load(std::memory_order_acquire) != 2 * i + 1) {
          }
          flag->store(2 * i + 2, std::memory_order_release);
        }
      }
      result = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / kTrips;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&window);
  }
  MPI_Comm_free(&host);
  MPI_Bcast(&result, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return result;
}

void run_p1_stores(const std::vector<tutti::TensorView>& views, int rounds, int steps) {
  const bool root = [] {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank == 0;
  }();
  for (int round = 0; round < rounds; ++round) {
    const double before = peer_roundtrip_ns();
    double ms[3] = {0, 0, 0};
    const char* choices[3] = {"0", "1", "auto"};
    for (int c = 0; c < 3; ++c) {
      setenv("TUTTI_SHM_STREAMING_STORES", choices[c], 1);
      tutti::init();
      ms[c] = p1_median_ms(views, steps);
      tutti::shutdown();
    }
    unsetenv("TUTTI_SHM_STREAMING_STORES");
    const double after = peer_roundtrip_ns();
    if (root) {
      std::printf(
          "P1-stores round=%d roundtrip_ns=%.0f,%.0f cached_ms=%.2f streaming_ms=%.2f "
          "auto_ms=%.2f\n",
          round, before, after, ms[0], ms[1], ms[2]);
      std::fflush(stdout);
    }
  }
}

}  // namespace tutti::examples
