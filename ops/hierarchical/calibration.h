// SPDX-License-Identifier: Apache-2.0
// From which buffer size a hierarchical backend runs its collectives hierarchically: fixed by
// the knobs (0 or 1), or measured when the set's backend is created (auto, the default).
//
// Note [Automatic hierarchy]
// Whether the hierarchy pays off depends on the network between hosts, the memory within them
// and the sizes, so TUTTI_HIERARCHICAL_ALLREDUCE/_ALLGATHER=auto (the default) measures it.
// When a set whose layout has a hierarchy gets its backend, every member runs both paths of
// each collective set to auto on kCalibrationBytes of float32 zeros (each size: a warm-up,
// then kCalibrationRuns runs of each path, alternating, each started by a barrier; a path's
// time is its best run, since on a shared machine the best run is the least disturbed one,
// and alternating keeps a burst of load from favouring one path). The times are
// then the slowest member's (a MAX allreduce), so every member decides from the same numbers.
// A path wins a size clearly when it took at most kCalibrationMargin of the other's time there;
// otherwise the size is a tie. Hierarchical runs from the smallest size it won clearly, provided
// flat won no size from there up clearly; below it, and at every size if no such size exists,
// flat. A tie does not stop the hierarchy: on 2 x 2 ranks in namespaces (2026-11-30) it took
// 0.53-0.79 of flat's time at 16 KiB and mostly tied at 256 KiB and 4 MiB, and was faster on
// the ResNet-50 set (P10: 0.69-0.89 of flat's time in three runs), while the earlier rule,
// which asked for a clear win at every larger size, chose flat in 11 of 12 sessions. Cost: a
// few hundred milliseconds per set on the development machine, once.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "ops/hierarchical/hierarchical_backend.h"
#include "ops/hierarchy.h"

namespace tutti::ops::hierarchical {

inline constexpr std::array<std::size_t, 3> kCalibrationBytes = {
    std::size_t{16} << 10, std::size_t{256} << 10, std::size_t{4} << 20};
inline constexpr int kCalibrationRuns = 5;
// Hierarchical must take at most this fraction of flat's time to count as faster: timing noise
// alone should not switch algorithms (best-of-5 times varied by about 10% between runs on the
// shared development machine).
inline constexpr double kCalibrationMargin = 0.9;

// What an automatic calibration measures: its sizes in bytes, ascending, and how many timed
// runs each path gets per size. Jobs always use the defaults; the unit tests pass smaller
// sizes, so that their threads-as-ranks backends measure in a fraction of a second under the
// sanitizers (the defaults took 31 s under ThreadSanitizer).
struct CalibrationPlan {
  std::array<std::size_t, 3> bytes = kCalibrationBytes;
  int runs = kCalibrationRuns;
};

// Collective over the backend's set (every member, at the same point, as the backend's
// creation is, with the same `plan`). Sets the backend's thresholds from `options`: Off =
// never, On = always, Auto = measured as `plan` says (Note [Automatic hierarchy]). `report`,
// if not null, receives a line of the measurements for the log.
Status settle_thresholds(HierarchicalBackend& backend, const HierarchyOptions& options,
                         std::string* report = nullptr, const CalibrationPlan& plan = {});

// Pure: the threshold from per-size times of both paths, measured at `bytes`' sizes (one time
// per size in each span).
std::size_t threshold_from(std::span<const double> flat_ms, std::span<const double> hierarchical_ms,
                           const std::array<std::size_t, 3>& bytes = kCalibrationBytes);

}  // namespace tutti::ops::hierarchical
