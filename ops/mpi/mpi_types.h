// SPDX-License-Identifier: Apache-2.0
// DataType and WireOp to MPI's types and ops; counts to MPI's int.
#pragma once

#include <cstddef>

#include <mpi.h>

#include "ops/backend.h"

namespace tutti::ops::mpi {

MPI_Datatype to_mpi_type(DataType dtype);
MPI_Op to_mpi_op(WireOp op);
// MPI counts are int; callers split larger ranges (see kMaxMpiCount).
int to_mpi_count(std::size_t count);
inline constexpr std::size_t kMaxMpiCount = std::size_t{1} << 30;

}  // namespace tutti::ops::mpi
