// SPDX-License-Identifier: Apache-2.0
// See Note [Automatic hierarchy] in calibration.h.
#include "ops/hierarchical/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "src/base/strings.h"

namespace tutti::ops::hierarchical {
namespace {

using Clock = std::chrono::steady_clock;

enum class Path { Flat, Hierarchical };
enum class Collective { Allreduce, Allgather };

// One run of `collective` on `bytes` of float32 zeros along `path`.
Status run_once(HierarchicalBackend& backend, Collective collective, Path path, std::size_t bytes,
                std::vector<float>& data, std::vector<float>& gathered) {
  Backend& runner = path == Path::Flat ? backend.flat() : static_cast<Backend&>(backend);
  const std::size_t count = bytes / sizeof(float);
  if (collective == Collective::Allreduce)
    return runner.allreduce(data.data(), count, DataType::Float32, WireOp::Sum);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(backend.size()),
                                        count / static_cast<std::size_t>(backend.size()));
  return runner.allgatherv(data.data(), gathered.data(), counts, DataType::Float32);
}

// Per calibration size, the best time of each path on this rank, in ms: flat's, then
// hierarchical's. The two paths alternate run by run, so that a burst of load on the machine
// slows both alike rather than one.
Result<std::vector<double>> time_paths(HierarchicalBackend& backend, Collective collective,
                                       const CalibrationPlan& plan) {
  const std::size_t largest = plan.bytes.back() / sizeof(float);
  std::vector<float> data(largest, 0.0f), gathered(largest, 0.0f);
  const std::size_t n = plan.bytes.size();
  std::vector<double> best(2 * n, 1e300);
  for (std::size_t i = 0; i < n; ++i) {
    for (int run = 0; run <= plan.runs; ++run) {  // Run 0 warms up.
      for (Path path : {Path::Flat, Path::Hierarchical}) {
        TUTTI_RETURN_IF_ERROR(backend.flat().barrier());
        const Clock::time_point start = Clock::now();
        TUTTI_RETURN_IF_ERROR(run_once(backend, collective, path, plan.bytes[i], data, gathered));
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        double& slot = best[path == Path::Flat ? i : n + i];
        if (run > 0) slot = std::min(slot, ms);
      }
    }
  }
  return best;
}

// The threshold of `collective` measured on `backend`; `report` gets the figures.
Result<std::size_t> measure(HierarchicalBackend& backend, Collective collective,
                            const CalibrationPlan& plan, std::string* report) {
  TUTTI_ASSIGN_OR_RETURN(std::vector<double> times, time_paths(backend, collective, plan));
  // The slowest member's times, the same numbers on every member.
  TUTTI_RETURN_IF_ERROR(
      backend.flat().allreduce(times.data(), times.size(), DataType::Float64, WireOp::Max));
  const std::span<const double> all(times);
  const std::size_t n = plan.bytes.size();
  const std::size_t threshold = threshold_from(all.first(n), all.subspan(n, n), plan.bytes);
  if (report != nullptr) {
    auto ms = [](double x) { return std::round(x * 1000.0) / 1000.0; };
    *report += detail::str_cat(collective == Collective::Allreduce ? "allreduce" : "allgather",
                               " flat/hierarchical");
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t bytes = plan.bytes[i];
      *report += detail::str_cat(
          i == 0 ? " " : ", ",
          bytes % 1024 == 0 ? detail::str_cat(bytes >> 10, " KiB") : detail::str_cat(bytes, " B"),
          " ", ms(all[i]), "/", ms(all[n + i]), " ms");
    }
    *report += "; ";
  }
  return threshold;
}

}  // namespace

std::size_t threshold_from(std::span<const double> flat_ms, std::span<const double> hierarchical_ms,
                           const std::array<std::size_t, 3>& bytes) {
  std::size_t threshold = HierarchicalBackend::kNever;
  // From the largest size down: a clear win moves the threshold down to it, a tie leaves it
  // (it joins a threshold a smaller size sets), a clear loss ends the scan, since "from a size
  // up" would then include a size where flat is faster. NaNs count as a loss.
  for (std::size_t i = bytes.size(); i-- > 0;) {
    const bool hierarchical_wins = hierarchical_ms[i] <= kCalibrationMargin * flat_ms[i];
    const bool flat_wins = flat_ms[i] <= kCalibrationMargin * hierarchical_ms[i];
    if (flat_wins || std::isnan(flat_ms[i]) || std::isnan(hierarchical_ms[i])) break;
    if (hierarchical_wins) threshold = bytes[i];
  }
  return threshold;
}

Status settle_thresholds(HierarchicalBackend& backend, const HierarchyOptions& options,
                         std::string* report, const CalibrationPlan& plan) {
  auto fixed = [](HierarchyMode mode) {
    return mode == HierarchyMode::On ? std::size_t{0} : HierarchicalBackend::kNever;
  };
  HierarchicalBackend::Thresholds thresholds{.allreduce_bytes = fixed(options.allreduce),
                                             .allgather_bytes = fixed(options.allgather)};
  if (options.allreduce == HierarchyMode::Auto || options.allgather == HierarchyMode::Auto) {
    backend.set_thresholds({.allreduce_bytes = 0, .allgather_bytes = 0});  // Both paths run.
    if (options.allreduce == HierarchyMode::Auto) {
      TUTTI_ASSIGN_OR_RETURN(thresholds.allreduce_bytes,
                             measure(backend, Collective::Allreduce, plan, report));
    }
    if (options.allgather == HierarchyMode::Auto) {
      TUTTI_ASSIGN_OR_RETURN(thresholds.allgather_bytes,
                             measure(backend, Collective::Allgather, plan, report));
    }
  }
  backend.set_thresholds(thresholds);
  return Status();
}

}  // namespace tutti::ops::hierarchical
