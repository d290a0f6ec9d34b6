// SPDX-License-Identifier: Apache-2.0
#include "examples/p1_autotune.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
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
// Timed P1 steps per comparison session (best of), after its warm-up step: a session's first
// steps run while the other rank may still be starting, and load on a shared machine comes in
// bursts, so one step per session was too noisy to compare settings 5 % apart.
constexpr int kStepsPerSession = 3;

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

// The "settled" row of the autotune log (columns: src/core/tuning/autotune.h, kLogHeader).
struct Settled {
  long long step = -1;  // -1: no settled row yet.
  long long threshold_bytes = -1;
  double cycle_time_ms = -1;
  char host_transport[16] = {};  // "shm/mpi" and the like; empty where it was not tuned.
};

Settled settled_row(const std::string& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::size_t start = 0;
    for (std::size_t comma; (comma = line.find(',', start)) != std::string::npos;) {
      fields.push_back(line.substr(start, comma - start));
      start = comma + 1;
    }
    fields.push_back(line.substr(start));
    if (fields.size() == 10 && fields[2] == "settled") {
      Settled settled{std::stoll(fields[1]), std::stoll(fields[3]), std::stod(fields[4])};
      std::snprintf(settled.host_transport, sizeof settled.host_transport, "%s", fields[5].c_str());
      return settled;
    }
  }
  return {};
}

// The settings of one comparison session; cycle_time_ms < 0, host_transport empty: the
// caller's.
struct Fixed {
  std::size_t threshold_bytes = 0;
  double cycle_time_ms = -1;
  std::string host_transport{};
};

// Sets a variable to `value` (nothing when empty) for its lifetime, then restores the
// caller's.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const std::string& value) : name_(name) {
    const char* caller = std::getenv(name);
    if (caller != nullptr) caller_ = caller;
    if (!value.empty()) setenv(name, value.c_str(), 1);
  }
  ~ScopedVariable() {
    if (caller_)
      setenv(name_, caller_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> caller_;
};

// P1 with `fixed` in a session of its own: one warm-up step, then the best of `repeats`.
double p1_fixed(const std::vector<tutti::TensorView>& views, const Fixed& fixed, int repeats,
                const P1Timer& p1_tutti) {
  const ScopedVariable cycle("TUTTI_CYCLE_TIME",
                             fixed.cycle_time_ms >= 0 ? std::to_string(fixed.cycle_time_ms) : "");
  const ScopedVariable transport("TUTTI_HOST_TRANSPORT", fixed.host_transport);
  setenv("TUTTI_FUSION_THRESHOLD", std::to_string(fixed.threshold_bytes).c_str(), 1);
  tutti::init();
  const double ms = p1_tutti(views, repeats);
  tutti::shutdown();
  unsetenv("TUTTI_FUSION_THRESHOLD");
  return ms;
}

// Runs P1 steps under TUTTI_AUTOTUNE=1 until rank 0's log has its settled row (at most
// kMaxAutotuneSteps); collective. Leaves the autotune variables unset.
Settled tune(const std::vector<tutti::TensorView>& views, int* steps, double* seconds,
             std::string* log) {
  setenv("TUTTI_AUTOTUNE", "1", 1);
  int pid = static_cast<int>(getpid());  // Rank 0's: one path on every rank.
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/tutti_p1_autotune_" + std::to_string(pid) + ".csv";
  setenv("TUTTI_AUTOTUNE_LOG", path.c_str(), 0);  // The caller's, if set.
  *log = std::getenv("TUTTI_AUTOTUNE_LOG");
  tutti::init();
  const Clock::time_point start = Clock::now();
  Settled settled;
  for (*steps = 0; *steps < kMaxAutotuneSteps && settled.step < 0; ++*steps) {
    p1_step(views);
    if (world_rank() == 0) settled = settled_row(*log);
    MPI_Bcast(&settled.step, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  }
  MPI_Bcast(&settled.threshold_bytes, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  MPI_Bcast(&settled.cycle_time_ms, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(settled.host_transport, sizeof settled.host_transport, MPI_CHAR, 0, MPI_COMM_WORLD);
  *seconds = std::chrono::duration<double>(Clock::now() - start).count();
  tutti::shutdown();
  // The comparison's sessions run without autotune, where init() refuses its settings.
  for (const char* prefix : {"TUTTI_", "HOROVOD_"}) {
    for (const char* knob : {"AUTOTUNE", "AUTOTUNE_LOG", "AUTOTUNE_WARMUP_SAMPLES",
                             "AUTOTUNE_STEPS_PER_SAMPLE", "AUTOTUNE_BAYES_OPT_MAX_SAMPLES"})
      unsetenv((std::string(prefix) + knob).c_str());
  }
  return settled;
}

}  // namespace

// The tuning, then `repeats` interleaved rounds over the sweep's thresholds (at the caller's
// cycle time), the tuned threshold alone and the tuned settings, each a fresh session with
// those fixed settings timing the best of kStepsPerSession steps (rounds, so that load which
// changes while it runs hits all alike). tuned_ms is the
// tuned settings' best, best_fixed_ms the best of the sweep's thresholds.
int run_p1_autotune(const std::vector<tutti::TensorView>& views, int repeats, double best_raw,
                    const P1Timer& p1) {
  const bool root = world_rank() == 0;
  int steps = 0;
  double seconds = 0;
  std::string log;
  const Settled tuned = tune(views, &steps, &seconds, &log);
  if (root) {
    std::printf("autotune: %s after %d P1 steps (%.1f s); log %s\n",
                tuned.step < 0 ? "did not settle" : "settled", steps, seconds, log.c_str());
  }
  if (tuned.step < 0) return 1;
  std::vector<Fixed> runs;
  for (std::size_t kib : kSweepKib) runs.push_back({.threshold_bytes = kib << 10});
  const auto threshold = static_cast<std::size_t>(tuned.threshold_bytes);
  std::size_t threshold_only = runs.size();  // The tuned threshold at the caller's cycle time.
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].threshold_bytes == threshold) threshold_only = i;
  }
  if (threshold_only == runs.size()) runs.push_back({.threshold_bytes = threshold});
  runs.push_back({.threshold_bytes = threshold,
                  .cycle_time_ms = tuned.cycle_time_ms,
                  .host_transport = tuned.host_transport});
  std::vector<double> best(runs.size(), 1e30);
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < runs.size(); ++i)
      best[i] = std::min(best[i], p1_fixed(views, runs[i], kStepsPerSession, p1));
  }
  double best_fixed_ms = 1e30;
  std::size_t best_fixed_bytes = 0;
  char cycle[96];
  std::snprintf(cycle, sizeof cycle, " TUTTI_CYCLE_TIME=%g%s%s", tuned.cycle_time_ms,
                tuned.host_transport[0] != '\0' ? " TUTTI_HOST_TRANSPORT=" : "",
                tuned.host_transport);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const bool last = i + 1 == runs.size();
    const char* what = last ? " (tuned)" : i == threshold_only ? " (tuned threshold)" : "";
    if (root) {
      std::printf("P1 at TUTTI_FUSION_THRESHOLD=%zu KB%s: %.2f ms%s\n",
                  runs[i].threshold_bytes >> 10, last ? cycle : "", best[i], what);
    }
    if (i < std::size(kSweepKib) && best[i] < best_fixed_ms)
      best_fixed_ms = best[i], best_fixed_bytes = runs[i].threshold_bytes;
  }
  const double tuned_ms = best.back();
  if (root) {
    std::printf(
        "P1-autotune tuned_ms=%.2f best_fixed_ms=%.2f ratio=%.3f threshold=%zu "
        "cycle_time_ms=%g host_transport=%s threshold_only_ms=%.2f best_fixed_threshold=%zu "
        "steps=%lld raw_ratio=%.3f\n",
        tuned_ms, best_fixed_ms, tuned_ms / best_fixed_ms, threshold, tuned.cycle_time_ms,
        tuned.host_transport[0] != '\0' ? tuned.host_transport : "-", best[threshold_only],
        best_fixed_bytes, tuned.step, tuned_ms / best_raw);
  }
  return 0;
}

}  // namespace tutti::examples
