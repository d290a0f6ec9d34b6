// SPDX-License-Identifier: Apache-2.0
// The host backend of a process set over MPI: the shared-memory or MPI backend of
// ops/shm/shm_backend.h (create_host_backend), or, when hierarchical collectives may be used
// and the set spans several hosts with the same number of members on each, the hierarchical
// backend over three communicators of the set: all members (MPI), this host's members (the
// shared-memory backend where TUTTI_HOST_TRANSPORT allows), the members with this local index
// (MPI).
#pragma once

#include <memory>

#include "ops/backend.h"
#include "ops/mpi/mpi_comm.h"
#include "ops/transport.h"

namespace tutti::ops::mpi {

// Collective over `comm` (every member, same order). Hosts are MPI's shared-memory domains
// (MPI_COMM_TYPE_SHARED): with Open MPI, the nodes mpirun launched on. A set on one host, with
// one member per host, or with different numbers of members on its hosts gets
// create_host_backend's whatever `options.hierarchy` says (logged at INFO when it says On):
// see Note [Hierarchical schedules] in
// ops/hierarchical/hierarchical_backend.h for what the hierarchy would need. Otherwise the
// hierarchical backend, whose thresholds `options` fix or, for Auto, measurements on this set
// (Note [Automatic hierarchy] in ops/hierarchical/calibration.h); the outcome is logged at INFO.
Result<std::unique_ptr<Backend>> make_set_backend(MpiComm comm, const BackendOptions& options);

}  // namespace tutti::ops::mpi
