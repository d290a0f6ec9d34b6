// SPDX-License-Identifier: Apache-2.0
// MPI return codes to Status, naming the failing call and quoting MPI's message.
#pragma once

#include <string>

#include <mpi.h>

#include "src/common/status.h"

namespace tutti::ops::mpi {

Status mpi_status(int code, const char* call);

}  // namespace tutti::ops::mpi

#define TUTTI_MPI_RETURN_IF_ERROR(call) \
  TUTTI_RETURN_IF_ERROR(::tutti::ops::mpi::mpi_status((call), #call))
