// SPDX-License-Identifier: Apache-2.0
#include "examples/p1_autotune.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>

#include <mpi.h>

namespace tutti::examples {
namespace {

using Clock = std::chrono::steady_clock;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// The sweep's thresholds (--sweep-fusion), in KiB.
constexpr std::size_t kSweepKib[] = {256, 1024, 2048, 4096, 8192, 16384, 65536};
constexpr int kMaxAutotuneSteps = 3000;

// One P1 step, untimed: every gradient via allreduce_async, then all waited.
void p1_step(const std::vector<tutti::TensorView>& tensors) {
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<tutti::Handle> handles;
  handles.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    handles.push_back(tutti::allreduce_async(tensors[i], "grad." + std::to_string(i)));
  }
  for (tutti::Handle& h : handles) h.wait();
}

// The "settled" row of the autotune log at `path` (rank 0), as {step, threshold}; {-1, -1}
// while there is none. Columns: src/core/autotune.h, kLogHeader.
std::pair<long long, long long> settled_row(const std::string& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::size_t start = 0;
    for (std::size_t comma; (comma = line.find(',', start)) != std::string::npos;) {
      fields.push_back(line.substr(start, comma - start));
      start = comma + 1;
    }
    fields.push_back(line.substr(start));
    if (fields.size() == 8 && fields[2] == "settled")
      return {std::stoll(fields[1]), std::stoll(fields[3])};
  }
  return {-1, -1};
}

// P1 with TUTTI_FUSION_THRESHOLD=`bytes` in a session of its own: one warm-up step, then the
// best of `repeats`.
double p1_fixed(const std::vector<tutti::TensorView>& views, std::size_t bytes, int repeats,
                const P1Timer& p1_tutti) {
  setenv("TUTTI_FUSION_THRESHOLD", std::to_string(bytes).c_str(), 1);
  tutti::init();
  const double ms = p1_tutti(views, repeats);
  tutti::shutdown();
  unsetenv("TUTTI_FUSION_THRESHOLD");
  return ms;
}

// P1 steps under TUTTI_AUTOTUNE=1 until rank 0's log has its settled row (at most
// kMaxAutotuneSteps), then the comparison: `repeats` interleaved rounds over the sweep's
// thresholds and the tuned one, each a fresh session with that fixed threshold (so load that
// changes while it runs hits all alike). tuned_ms is the tuned threshold's best, best_fixed_ms
// the best of the sweep's thresholds.
}  // namespace

int run_p1_autotune(const std::vector<tutti::TensorView>& views, int repeats, double best_raw,
                    const P1Timer& p1) {
  const bool root = world_rank() == 0;
  setenv("TUTTI_AUTOTUNE", "1", 1);
  int pid = static_cast<int>(getpid());  // Rank 0's: one path on every rank.
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/tutti_p1_autotune_" + std::to_string(pid) + ".csv";
  setenv("TUTTI_AUTOTUNE_LOG", path.c_str(), 0);  // The caller's, if set.
  const std::string log = std::getenv("TUTTI_AUTOTUNE_LOG");
  tutti::init();
  const Clock::time_point start = Clock::now();
  long long found[2] = {-1, -1};  // The settled row's step and threshold.
  int steps = 0;
  for (; steps < kMaxAutotuneSteps && found[0] < 0; ++steps) {
    p1_step(views);
    if (root) std::tie(found[0], found[1]) = settled_row(log);
    MPI_Bcast(found, 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  }
  const double tuning_s = std::chrono::duration<double>(Clock::now() - start).count();
  tutti::shutdown();
  // The comparison's sessions run without autotune, where init() refuses its settings.
  for (const char* prefix : {"TUTTI_", "HOROVOD_"}) {
    for (const char* knob : {"AUTOTUNE", "AUTOTUNE_LOG", "AUTOTUNE_WARMUP_SAMPLES",
                             "AUTOTUNE_STEPS_PER_SAMPLE", "AUTOTUNE_BAYES_OPT_MAX_SAMPLES"})
      unsetenv((std::string(prefix) + knob).c_str());
  }
  if (root) {
    std::printf("autotune: %s after %d P1 steps (%.1f s); log %s\n",
                found[0] < 0 ? "did not settle" : "settled", steps, tuning_s, log.c_str());
  }
  if (found[0] < 0) return 1;
  const auto tuned = static_cast<std::size_t>(found[1]);
  std::vector<std::size_t> thresholds;
  for (std::size_t kib : kSweepKib) thresholds.push_back(kib << 10);
  if (std::find(thresholds.begin(), thresholds.end(), tuned) == thresholds.end())
    thresholds.push_back(tuned);
  std::vector<double> best(thresholds.size(), 1e30);
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < thresholds.size(); ++i)
      best[i] = std::min(best[i], p1_fixed(views, thresholds[i], 1, p1));
  }
  double best_fixed_ms = 1e30, tuned_ms = 1e30;
  std::size_t best_fixed_bytes = 0;
  for (std::size_t i = 0; i < thresholds.size(); ++i) {
    if (root) {
      std::printf("P1 at TUTTI_FUSION_THRESHOLD=%zu KB: %.2f ms%s\n", thresholds[i] >> 10, best[i],
                  thresholds[i] == tuned ? " (tuned)" : "");
    }
    if (thresholds[i] == tuned) tuned_ms = best[i];
    if (i < std::size(kSweepKib) && best[i] < best_fixed_ms)
      best_fixed_ms = best[i], best_fixed_bytes = thresholds[i];
  }
  if (root) {
    std::printf(
        "P1-autotune tuned_ms=%.2f best_fixed_ms=%.2f ratio=%.3f threshold=%zu "
        "best_fixed_threshold=%zu steps=%lld raw_ratio=%.3f\n",
        tuned_ms, best_fixed_ms, tuned_ms / best_fixed_ms, tuned, best_fixed_bytes, found[0],
        tuned_ms / best_raw);
  }
  return 0;
}

}  // namespace tutti::examples
