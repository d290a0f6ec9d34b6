// SPDX-License-Identifier: Apache-2.0
// See p10_hierarchical.h.
#include "examples/p10_hierarchical.h"

#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <mpi.h>

namespace tutti::examples {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The slowest rank decides.
double max_over_ranks(double value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return value;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `iterations` (after 3 warm-ups) of f(), each timed between barriers.
template <class F>
double median_ms(int iterations, F&& f) {
  std::vector<double> times;
  for (int i = 0; i < iterations + 3; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    f();
    const double ms = max_over_ranks(ms_since(start));
    if (i >= 3) times.push_back(ms);
  }
  return median(times);
}

// Best over `repeats` rounds (after one warm-up) of f().
template <class F>
double best_ms(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    f();
    const double ms = max_over_ranks(ms_since(start));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

struct Figures {
  std::vector<double> single_ms;  // Per size.
  double set_ms = 0;
};

// Tutti's figures with hierarchical allreduce on or off.
Figures measure_tutti(bool hierarchical, std::vector<std::vector<float>>& grads,
                      std::vector<std::vector<float>>& singles, int repeats, int iterations) {
  setenv("TUTTI_HIERARCHICAL_ALLREDUCE", hierarchical ? "1" : "0", 1);
  tutti::init();
  Figures figures;
  for (std::vector<float>& single : singles) {
    const tutti::TensorView view(single.data(), {static_cast<std::int64_t>(single.size())});
    figures.single_ms.push_back(median_ms(
        iterations, [&] { tutti::allreduce(view, "p10.single", {.op = tutti::ReduceOp::Sum}); }));
  }
  std::vector<tutti::TensorView> views;
  for (std::vector<float>& grad : grads)
    views.emplace_back(grad.data(), tutti::Shape{static_cast<std::int64_t>(grad.size())});
  figures.set_ms = best_ms(repeats, [&] {
    std::vector<tutti::Handle> handles;
    for (std::size_t i = 0; i < views.size(); ++i)
      handles.push_back(tutti::allreduce_async(views[i], "grad." + std::to_string(i)));
    for (tutti::Handle& h : handles) h.wait();
  });
  tutti::shutdown();
  return figures;
}

}  // namespace

int run_p10(const std::vector<std::int64_t>& grad_counts,
            const std::vector<std::int64_t>& sizes_bytes, int repeats, int iterations) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::vector<float>> grads, singles;
  std::size_t total = 0;
  for (std::int64_t n : grad_counts) {
    grads.emplace_back(static_cast<std::size_t>(n), 1.0f);
    total += static_cast<std::size_t>(n);
  }
  for (std::int64_t bytes : sizes_bytes)
    singles.emplace_back(static_cast<std::size_t>(bytes) / sizeof(float), 1.0f);

  tutti::init();  // Only to print the layout the runs see.
  const int local_size = tutti::local_size(), cross_size = tutti::cross_size();
  const bool homogeneous = tutti::is_homogeneous();
  tutti::shutdown();
  if (rank == 0) {
    std::printf(
        "P10 layout: ranks=%d local_size=%d cross_size=%d homogeneous=%d gradients=%zu "
        "floats=%zu (%.1f MB)\n",
        size, local_size, cross_size, homogeneous ? 1 : 0, grads.size(), total, total * 4.0 / 1e6);
    if (local_size < 2 || cross_size < 2 || !homogeneous) {
      std::printf(
          "P10 note: hierarchical collectives need several hosts with the same number "
          "(>= 2) of ranks each; here they run flat\n");
    }
    std::fflush(stdout);
  }
  // Raw MPI: each single size as one call, the set as P1 (best of 1, 4, 16, 64 MB pieces).
  std::vector<double> raw_single;
  for (std::vector<float>& single : singles) {
    raw_single.push_back(median_ms(iterations, [&] {
      MPI_Allreduce(MPI_IN_PLACE, single.data(), static_cast<int>(single.size()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
    }));
  }
  std::vector<float> flat(total, 1.0f);
  double raw_set = 1e30;
  for (std::size_t mb : {1, 4, 16, 64}) {
    const std::size_t piece = (mb << 20) / sizeof(float);
    raw_set = std::min(raw_set, best_ms(repeats, [&] {
                         for (std::size_t off = 0; off < flat.size(); off += piece) {
                           const int n = static_cast<int>(std::min(piece, flat.size() - off));
                           MPI_Allreduce(MPI_IN_PLACE, flat.data() + off, n, MPI_FLOAT, MPI_SUM,
                                         MPI_COMM_WORLD);
                         }
                       }));
  }
  const Figures plain = measure_tutti(false, grads, singles, repeats, iterations);
  const Figures hierarchical = measure_tutti(true, grads, singles, repeats, iterations);
  unsetenv("TUTTI_HIERARCHICAL_ALLREDUCE");
  if (rank == 0) {
    for (std::size_t i = 0; i < singles.size(); ++i) {
      std::printf("P10 size_bytes=%lld flat_ms=%.3f hierarchical_ms=%.3f raw_ms=%.3f\n",
                  static_cast<long long>(sizes_bytes[i]), plain.single_ms[i],
                  hierarchical.single_ms[i], raw_single[i]);
    }
    std::printf("P10 flat_ms=%.2f hierarchical_ms=%.2f raw_ms=%.2f\n", plain.set_ms,
                hierarchical.set_ms, raw_set);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tutti::examples
