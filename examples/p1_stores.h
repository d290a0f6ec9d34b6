// SPDX-License-Identifier: Apache-2.0
// allreduce_benchmark --stores (issue 26): P1 over shared memory with each choice of
// TUTTI_SHM_STREAMING_STORES, round after round, each round with the cache-line round trip
// between ranks 0 and 1 that tells which placement of their CPUs the round ran in (Note
// [Streaming stores] in ops/shm/staging.h).
#pragma once

#include <tutti/tutti.h>

#include <vector>

namespace tutti::examples {

// Collective over MPI_COMM_WORLD; Tutti must not be initialized (this starts and stops a
// session per measurement, and leaves TUTTI_SHM_STREAMING_STORES unset). Each of `rounds`
// rounds measures the round trip, then P1 under 0, 1 and auto (the median of `steps` steps after
// a warm-up step, max over ranks), then the round trip again; rank 0 prints a line per round:
// "P1-stores round=<k> roundtrip_ns=<before>,<after> cached_ms=... streaming_ms=... auto_ms=...".
// The round trip is -1 where ranks 0 and 1 share no host (or the job has one rank).
void run_p1_stores(const std::vector<tutti::TensorView>& views, int rounds, int steps);

// The median time, in nanoseconds, of a cache line's round trip between ranks 0 and 1 through
// a shared window (each spins on its own CPU); -1 where they share no host. Collective.
double peer_roundtrip_ns();

}  // namespace tutti::examples
