// SPDX-License-Identifier: Apache-2.0
// Running Tutti inside an application that manages MPI itself. The only public header that
// includes <mpi.h>.
#pragma once

#include <mpi.h>

#include "tutti/export.h"

namespace tutti {

// Like init(), over a duplicate of `comm` instead of MPI_COMM_WORLD: ranks, sizes and process
// sets are then relative to `comm`. Collective over `comm`. MPI must already be initialized with
// at least MPI_THREAD_SERIALIZED; below MPI_THREAD_MULTIPLE the application must not call MPI
// while Tutti has ops in flight. Throws InvalidArgument if MPI is not initialized, if its thread
// level is too low, or for a malformed setting.
TUTTI_API void init(MPI_Comm comm);

}  // namespace tutti
