// SPDX-License-Identifier: Apache-2.0
// See p10_hierarchical.h.
#include "examples/p10_hierarchical.h"

#include <tutti/tutti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>

#include <mpi.h>

#include "examples/figures.h"

namespace tutti::examples {
namespace {

using Clock = std::chrono::steady_clock;

// Raw MPI's set runs once per piece size and keeps the best, so Tutti's set runs as many times:
// on a shared machine the best of four draws is lower than one draw, whatever is measured.
constexpr std::size_t kRawPieceMb[] = {1, 4, 16, 64};
constexpr int kSetRuns = static_cast<int>(std::size(kRawPieceMb));

// Best over `runs` (after `warmups`) of f(), each timed between barriers: on a shared machine
// the best run is the one the scheduler disturbed least.
template <class F>
double best_ms(int warmups, int runs, F&& f) {
  double best = 1e30;
  for (int i = 0; i < warmups + runs; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const Clock::time_point start = Clock::now();
    f();
    const double ms = max_over_ranks(ms_since(start));
    if (i >= warmups) best = std::min(best, ms);
  }
  return best;
}

// One contender's figures: per single size, then the gradient set.
struct Figures {
  std::vector<double> single_ms;
  double set_ms = 1e30;

  void keep_best(const Figures& other) {
    if (single_ms.empty()) single_ms.assign(other.single_ms.size(), 1e30);
    for (std::size_t i = 0; i < single_ms.size(); ++i)
      single_ms[i] = std::min(single_ms[i], other.single_ms[i]);
    set_ms = std::min(set_ms, other.set_ms);
  }
};

struct Data {
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> singles;
  std::vector<float> flat;  // The gradient set as one buffer, for raw MPI.
};

// Raw MPI: each single size as one MPI_Allreduce; the set as P1's reference, the best of 1, 4,
// 16 and 64 MB pieces.
Figures measure_raw(Data& data, int iterations) {
  Figures figures;
  for (std::vector<float>& single : data.singles) {
    figures.single_ms.push_back(best_ms(3, iterations, [&] {
      MPI_Allreduce(MPI_IN_PLACE, single.data(), static_cast<int>(single.size()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
    }));
  }
  for (std::size_t mb : kRawPieceMb) {
    const std::size_t piece = (mb << 20) / sizeof(float);
    figures.set_ms = std::min(figures.set_ms, best_ms(1, 1, [&] {
                                for (std::size_t off = 0; off < data.flat.size(); off += piece) {
                                  const int n =
                                      static_cast<int>(std::min(piece, data.flat.size() - off));
                                  MPI_Allreduce(MPI_IN_PLACE, data.flat.data() + off, n, MPI_FLOAT,
                                                MPI_SUM, MPI_COMM_WORLD);
                                }
                              }));
  }
  return figures;
}

// Tutti with TUTTI_HIERARCHICAL_ALLREDUCE=`hierarchical` ("0", "1" or "auto"; a session of its
// own): single sizes via allreduce (Sum), the set via allreduce_async of every gradient
// (Average), then all waited.
Figures measure_tutti(const char* hierarchical, Data& data, int iterations) {
  setenv("TUTTI_HIERARCHICAL_ALLREDUCE", hierarchical, 1);
  tutti::init();
  Figures figures;
  for (std::vector<float>& single : data.singles) {
    const tutti::TensorView view(single.data(), {static_cast<std::int64_t>(single.size())});
    figures.single_ms.push_back(best_ms(3, iterations, [&] {
      tutti::allreduce(view, "p10.single", {.op = tutti::ReduceOp::Sum});
    }));
  }
  std::vector<tutti::TensorView> views;
  for (std::vector<float>& grad : data.grads)
    views.emplace_back(grad.data(), tutti::Shape{static_cast<std::int64_t>(grad.size())});
  figures.set_ms = best_ms(1, kSetRuns, [&] {
    std::vector<tutti::Handle> handles;
    for (std::size_t i = 0; i < views.size(); ++i)
      handles.push_back(tutti::allreduce_async(views[i], "grad." + std::to_string(i)));
    for (tutti::Handle& h : handles) h.wait();
  });
  tutti::shutdown();
  unsetenv("TUTTI_HIERARCHICAL_ALLREDUCE");
  return figures;
}

// Rank 0 prints the layout the runs see, and says when it has no hierarchy.
void print_layout(const Data& data) {
  tutti::init();
  const int rank = tutti::rank(), size = tutti::size();
  const int local_size = tutti::local_size(), cross_size = tutti::cross_size();
  const bool homogeneous = tutti::is_homogeneous();
  tutti::shutdown();
  if (rank != 0) return;
  std::printf(
      "P10 layout: ranks=%d local_size=%d cross_size=%d homogeneous=%d gradients=%zu "
      "floats=%zu (%.1f MB)\n",
      size, local_size, cross_size, homogeneous ? 1 : 0, data.grads.size(), data.flat.size(),
      static_cast<double>(data.flat.size()) * 4.0 / 1e6);
  if (local_size < 2 || cross_size < 2 || !homogeneous) {
    std::printf(
        "P10 note: hierarchical collectives need several hosts with the same number "
        "(>= 2) of ranks each; here they run flat\n");
  }
  std::fflush(stdout);
}

}  // namespace

int run_p10(const std::vector<std::int64_t>& grad_counts,
            const std::vector<std::int64_t>& sizes_bytes, int rounds, int iterations) {
  Data data;
  std::size_t total = 0;
  for (std::int64_t n : grad_counts) {
    data.grads.emplace_back(static_cast<std::size_t>(n), 1.0f);
    total += static_cast<std::size_t>(n);
  }
  data.flat.assign(total, 1.0f);
  for (std::int64_t bytes : sizes_bytes)
    data.singles.emplace_back(static_cast<std::size_t>(bytes) / sizeof(float), 1.0f);
  print_layout(data);
  // Round after round of the four contenders, each keeping its best: a burst of load on the
  // machine then hurts one round of all four, not one contender.
  Figures raw, plain, hierarchical, automatic;
  for (int round = 0; round < rounds; ++round) {
    raw.keep_best(measure_raw(data, iterations));
    plain.keep_best(measure_tutti("0", data, iterations));
    hierarchical.keep_best(measure_tutti("1", data, iterations));
    automatic.keep_best(measure_tutti("auto", data, iterations));
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    for (std::size_t i = 0; i < data.singles.size(); ++i) {
      std::printf(
          "P10 size_bytes=%lld flat_ms=%.3f hierarchical_ms=%.3f raw_ms=%.3f auto_ms=%.3f\n",
          static_cast<long long>(sizes_bytes[i]), plain.single_ms[i], hierarchical.single_ms[i],
          raw.single_ms[i], automatic.single_ms[i]);
    }
    std::printf("P10 flat_ms=%.2f hierarchical_ms=%.2f raw_ms=%.2f auto_ms=%.2f\n", plain.set_ms,
                hierarchical.set_ms, raw.set_ms, automatic.set_ms);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tutti::examples
