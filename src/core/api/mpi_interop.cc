// SPDX-License-Identifier: Apache-2.0
// This file includes <mpi.h> although it is in core: it is the entry point behind the public
// tutti/mpi_interop.h, and passes the communicator on as an opaque pointer (STYLE.md 2.1).
#include "tutti/mpi_interop.h"

#include "src/core/runtime.h"

namespace tutti {

void init(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    throw Error(ErrorCode::InvalidArgument, "tutti::init(MPI_Comm) needs MPI to be initialized");
  }
  core::Runtime::get().init(&comm).throw_if_error();
}

}  // namespace tutti
