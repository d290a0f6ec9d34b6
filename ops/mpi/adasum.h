// SPDX-License-Identifier: Apache-2.0
// Adasum (adaptive summation, Maleki et al. 2021) over an MPI communicator: Horovod's recursive
// vector-halving, distance-doubling algorithm for a power-of-two number of ranks.
#pragma once

#include <cstddef>
#include <span>

#include <mpi.h>

#include "src/common/status.h"
#include "tutti/tensor.h"

namespace tutti::ops::mpi {

// Combines every rank's `data` in place, so that every rank ends with
//   adasum(v_0, ..., v_{n-1}) = combine(adasum(first half of the ranks), adasum(second half)),
//   combine(a, b) = (1 - a·b / (2|a|²)) a + (1 - a·b / (2|b|²)) b,
// computed separately for each of the consecutive tensors of `tensor_counts` elements (a
// coefficient whose norm is below 1e-8 is 1, as in Horovod, so a zero vector adds nothing).
// Dot products and norms are accumulated in double. `dtype` is Float32 or Float64; the size
// of `comm` must be a power of two. Collective over `comm`; communication thread only.
Status adasum_allreduce(MPI_Comm comm, void* data, std::span<const std::size_t> tensor_counts,
                        DataType dtype);

}  // namespace tutti::ops::mpi
