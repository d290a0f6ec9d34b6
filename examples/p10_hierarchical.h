// SPDX-License-Identifier: Apache-2.0
// P10 of DESIGN.md section 6 for allreduce_benchmark --p10: on several hosts with several ranks
// each (2 x 2 in the README's figures, on network namespaces), Tutti's allreduce with flat, with
// hierarchical and with automatically chosen collectives, against raw MPI_Allreduce over the
// same ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace tutti::examples {

// Collective over MPI_COMM_WORLD (MPI initialized, Tutti not): prints, on rank 0,
//   P10 size_bytes=<n> flat_ms=<x> hierarchical_ms=<y> raw_ms=<z> auto_ms=<a>   one tensor
//   P10 flat_ms=<x> hierarchical_ms=<y> raw_ms=<z> auto_ms=<a>                  the gradient set
// for one float32 tensor of each size in `sizes_bytes` (allreduce, Sum; the best of
// `iterations` after 3 warm-ups) and for every tensor of `grad_counts` via allreduce_async
// then waited (Average; the best of 4 runs after a warm-up). Raw is MPI_Allreduce (Sum) of the
// same bytes as one call, or for the set, the best of 1, 4, 16 and 64 MB pieces as P1 (one run
// each after a warm-up: 4 runs too). Tutti runs with TUTTI_HIERARCHICAL_ALLREDUCE=0, =1 and
// =auto, a session each; auto, the default, measures both paths when the session starts and
// picks by size (Note [Automatic hierarchy] in ops/hierarchical/calibration.h): what a user
// gets. The four are measured `rounds` times in turn and each figure is its best round.
// Returns the exit code.
int run_p10(const std::vector<std::int64_t>& grad_counts,
            const std::vector<std::int64_t>& sizes_bytes, int rounds, int iterations);

}  // namespace tutti::examples
