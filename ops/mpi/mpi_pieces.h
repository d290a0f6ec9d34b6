// SPDX-License-Identifier: Apache-2.0
// Point-to-point transfers of any length: MPI counts are int, so a range longer than
// max_mpi_count() elements travels as several messages. The collectives whose int counts and
// displacements cannot describe a large layout (allgatherv, alltoallv, reduce_scatter, Adasum's
// exchanges) fall back to these.
#pragma once

#include <cstddef>

#include <mpi.h>

#include "src/common/status.h"

namespace tutti::ops::mpi {

// Sends `send_count` elements of `type` (`element_bytes` each) from `send` to `send_to` and
// receives `recv_count` from `recv_from` into `recv`, each in pieces of at most
// max_mpi_count(). The peers' calls must mirror this one (the sender's send_count is the
// receiver's recv_count), so piece boundaries agree. Either peer may be this rank.
Status exchange_in_pieces(const void* send, std::size_t send_count, int send_to, void* recv,
                          std::size_t recv_count, int recv_from, MPI_Datatype type,
                          std::size_t element_bytes, int tag, MPI_Comm comm);

}  // namespace tutti::ops::mpi
