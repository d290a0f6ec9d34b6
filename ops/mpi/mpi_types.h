// SPDX-License-Identifier: Apache-2.0
// DataType and WireOp to MPI's types and ops; counts to MPI's int.
#pragma once

#include <cstddef>

#include <mpi.h>

#include "ops/backend.h"

namespace tutti::ops::mpi {

MPI_Datatype to_mpi_type(DataType dtype);
MPI_Op to_mpi_op(WireOp op);
// MPI counts are int; callers split larger ranges into pieces of at most max_mpi_count().
int to_mpi_count(std::size_t count);
// The most elements one MPI call carries: 2^30 (within int, whatever the datatype).
std::size_t max_mpi_count();
// Tests lower the piece size to exercise the piecewise paths at small sizes; 0 restores the
// default. Set it only while no collective runs.
void set_max_mpi_count_for_testing(std::size_t count);

}  // namespace tutti::ops::mpi
