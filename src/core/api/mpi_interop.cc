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
  // MPI_COMM_NULL is no communicator: the first collective on it would end the job through
  // MPI's default error handler (MPI_ERRORS_ARE_FATAL) instead of failing this call.
  if (comm == MPI_COMM_NULL) {
    throw Error(ErrorCode::InvalidArgument,
                "tutti::init(MPI_Comm) got MPI_COMM_NULL (a rank outside an MPI_Comm_split's "
                "colours gets it): call it with a communicator this rank belongs to");
  }
  core::Runtime::get().init(&comm).throw_if_error();
}

}  // namespace tutti
