// SPDX-License-Identifier: Apache-2.0
// P10 of DESIGN.md section 6 for allreduce_benchmark --p10: on several hosts with several ranks
// each (2 x 2 in the README's figures, on network namespaces), Tutti's allreduce with flat and
// with hierarchical collectives, against raw MPI_Allreduce over the same ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace tutti::examples {

// Collective over MPI_COMM_WORLD (MPI initialized, Tutti not): prints, on rank 0,
//   P10 size_bytes=<n> flat_ms=<x> hierarchical_ms=<y> raw_ms=<z>   one tensor of n bytes
//   P10 flat_ms=<x> hierarchical_ms=<y> raw_ms=<z>                  the gradient set
// for one float32 tensor of each size in `sizes_bytes` (allreduce, Sum; the best of
// `iterations` after 3 warm-ups) and for every tensor of `grad_counts` via allreduce_async
// then waited (Average; the best of 4 runs after a warm-up). Raw is MPI_Allreduce (Sum) of the
// same bytes as one call, or for the set, the best of 1, 4, 16 and 64 MB pieces as P1 (one run
// each after a warm-up: 4 runs too). Tutti runs with TUTTI_HIERARCHICAL_ALLREDUCE=0 and =1, a
// session each. The three are measured `rounds` times in turn and each figure is its best
// round. Returns the exit code.
int run_p10(const std::vector<std::int64_t>& grad_counts,
            const std::vector<std::int64_t>& sizes_bytes, int rounds, int iterations);

}  // namespace tutti::examples
