// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_pieces.h"

#include <algorithm>
#include <vector>

#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_types.h"

namespace tutti::ops::mpi {

Status exchange_in_pieces(const void* send, std::size_t send_count, int send_to, void* recv,
                          std::size_t recv_count, int recv_from, MPI_Datatype type,
                          std::size_t element_bytes, int tag, MPI_Comm comm) {
  const std::size_t piece = max_mpi_count();
  std::vector<MPI_Request> requests;
  // Messages between two ranks with one tag arrive in order, so the i-th piece sent meets the
  // i-th receive. Receives first, so that no piece waits in an unexpected-message queue.
  for (std::size_t done = 0; done < recv_count; done += piece) {
    const std::size_t n = std::min(piece, recv_count - done);
    requests.emplace_back();
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Irecv(static_cast<std::byte*>(recv) + done * element_bytes,
                                        to_mpi_count(n), type, recv_from, tag, comm,
                                        &requests.back()));
  }
  for (std::size_t done = 0; done < send_count; done += piece) {
    const std::size_t n = std::min(piece, send_count - done);
    requests.emplace_back();
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Isend(static_cast<const std::byte*>(send) + done * element_bytes,
                                        to_mpi_count(n), type, send_to, tag, comm,
                                        &requests.back()));
  }
  TUTTI_MPI_RETURN_IF_ERROR(
      MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  return Status();
}

}  // namespace tutti::ops::mpi
