// SPDX-License-Identifier: Apache-2.0
// allreduce_benchmark --recorder (issue 26): what the flight recorder (tutti/debug.h, on by
// default) costs P3, its per-op worst case. The two settings alternate within one process, a
// session each, so that a machine whose speed drifts (the 2-core VMs switch modes within
// minutes) slows both alike: separate runs could not tell them apart (examples/
// BENCHMARK_LOG.md, thirty-fourth round).
#pragma once

namespace tutti::examples {

// Collective over MPI_COMM_WORLD; Tutti must not be initialized (this starts and stops a
// session per measurement). The recorder "on" is the caller's TUTTI_FLIGHT_RECORDER_SIZE (its
// default, 2000, if unset), "off" is 0; the caller's setting is restored at the end. Each of
// `rounds` rounds runs P3 with the recorder on and off (the order swapped every round; two
// warm-up steps, then the median of `steps`) and raw MPI's loop (the median of `steps` after
// one warm-up), and rank 0 prints "P3-recorder round=<k> on_ms=... off_ms=... raw_ms=...";
// then "P3-recorder rounds=... steps=... on_ms=... off_ms=... raw_ms=... on_over_off=...
// on_over_raw=... off_over_raw=...", each the median over the rounds (of the per-round ratios,
// for the ratios). Returns the exit code: 2 if the caller's setting is 0 (nothing to compare),
// 1 if a step's sums were wrong, else 0.
int run_p3_recorder(int rounds, int steps);

}  // namespace tutti::examples
