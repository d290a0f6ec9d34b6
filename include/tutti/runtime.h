// SPDX-License-Identifier: Apache-2.0
// Starting and stopping Tutti, and where this process stands in the job (API.md, "Runtime").
#pragma once

#include <string>

#include "tutti/export.h"

namespace tutti {

// Starts the runtime: initializes MPI with MPI_THREAD_MULTIPLE unless the application already
// did, duplicates MPI_COMM_WORLD, reads the TUTTI_* (else HOROVOD_*) environment and starts the
// background thread. Collective over MPI_COMM_WORLD. Calling it while initialized does nothing.
// Throws InvalidArgument naming the variable for a malformed setting, Communication if MPI fails.
TUTTI_API void init();

// Stops the runtime: ops still pending fail with ShutDown, the background thread ends and the
// communicators are freed. Collective (every rank calls it); idempotent; never finalizes MPI
// (Tutti finalizes MPI at process exit if it initialized it). init() may be called again.
TUTTI_API void shutdown();

TUTTI_API bool is_initialized();

// Where this process stands. Each throws NotInitialized outside a session.
TUTTI_API int rank();  // In the global process set.
TUTTI_API int size();
TUTTI_API int local_rank();  // Among the ranks on this host.
TUTTI_API int local_size();
TUTTI_API int cross_rank();  // Among the ranks with the same local_rank, across hosts.
TUTTI_API int cross_size();
TUTTI_API bool is_homogeneous();         // Every host runs the same number of ranks.
TUTTI_API bool mpi_threads_supported();  // MPI provides MPI_THREAD_MULTIPLE.
// Some host runs at least as many of the job's ranks as it has cores (its online CPUs within
// the limits of the ranks' cgroups: a cpuset, a CPU quota). The same on every rank.
TUTTI_API bool cores_shared();
// The gradient groups of an optim::DistributedOptimizer whose options name no num_groups and
// no groups: 1 (one grouped allreduce once every gradient is ready) or 0 (each gradient's
// allreduce starts the moment it is ready). TUTTI_GRADIENT_GROUPING decides: each, one, or
// auto (the default): 1 where cores_shared(), since overlap needs spare cores and each message
// costs a share of them, else 0. The same on every rank; 0 outside a session.
TUTTI_API int default_gradient_groups();

// Compile-time facts about this build; callable any time.
TUTTI_API bool cuda_built();
TUTTI_API bool nccl_built();

// Starts writing a Chrome-trace timeline to `path` (rank 0 writes; other ranks only record
// nothing). Collective, with one outcome: if rank 0 cannot open `path`, every rank throws
// InvalidArgument with rank 0's message. Replaces a timeline already running. See README
// "Timeline".
TUTTI_API void start_timeline(const std::string& path, bool mark_cycles = false);
// Stops the timeline, leaving a complete JSON file. Collective. No-op if none runs.
TUTTI_API void stop_timeline();

}  // namespace tutti
