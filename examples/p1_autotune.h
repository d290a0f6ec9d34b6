// SPDX-License-Identifier: Apache-2.0
// allreduce_benchmark --autotune (issue 12): P1 under TUTTI_AUTOTUNE=1 until the tuner
// settles, then P1 at the tuned threshold against the best fixed one of --sweep-fusion's list.
#pragma once

#include <tutti/tutti.h>

#include <functional>
#include <vector>

namespace tutti::examples {

// P1's timing in the current session: every tensor of `views` via allreduce_async, then all
// waited; the best of `repeats` rounds after a warm-up round, max over ranks. Collective.
using P1Timer = std::function<double(const std::vector<tutti::TensorView>& views, int repeats)>;

// Collective over MPI_COMM_WORLD; Tutti must not be initialized (this starts and stops its
// own sessions, and leaves TUTTI_FUSION_THRESHOLD and the autotune variables unset). The
// tuning takes the caller's TUTTI_AUTOTUNE_* settings; the log goes to TUTTI_AUTOTUNE_LOG if
// set, else /tmp/tutti_p1_autotune_<pid>.csv. Rank 0 prints the tuning, the comparison and
// the line "P1-autotune tuned_ms=... best_fixed_ms=... ratio=... threshold=...
// cycle_time_ms=... host_transport=... threshold_only_ms=... best_fixed_threshold=... steps=...
// raw_ratio=..." (host_transport: the tuned host routes as TUTTI_HOST_TRANSPORT takes them, or
// - where they were not tuned; threshold_only_ms: the tuned threshold at the caller's cycle
// time and host transport; raw_ratio: tuned_ms over `best_raw_ms`). Returns the exit code: 1 if the
// tuner did not settle within 3000 steps.
int run_p1_autotune(const std::vector<tutti::TensorView>& views, int repeats, double best_raw_ms,
                    const P1Timer& p1);

}  // namespace tutti::examples
