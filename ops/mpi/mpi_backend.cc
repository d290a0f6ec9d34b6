// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_backend.h"

#include <algorithm>
#include <vector>

#include "ops/mpi/adasum.h"
#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_types.h"
#include "src/common/check.h"

namespace tutti::ops::mpi {
namespace {

std::byte* at(void* base, std::size_t elements, std::size_t element_bytes) {
  return static_cast<std::byte*>(base) + elements * element_bytes;
}

// Counts and displacements for the v-collectives, which take int.
struct IntLayout {
  std::vector<int> counts;
  std::vector<int> displacements;
};

IntLayout int_layout(std::span<const std::size_t> counts) {
  IntLayout layout;
  std::size_t offset = 0;
  for (std::size_t count : counts) {
    layout.counts.push_back(to_mpi_count(count));
    layout.displacements.push_back(to_mpi_count(offset));
    offset += count;
  }
  return layout;
}

}  // namespace

Status MpiBackend::allreduce(void* data, std::size_t count, DataType dtype, WireOp op) {
  const std::size_t bytes = element_size(dtype);
  for (std::size_t done = 0; done < count;) {
    const std::size_t piece = std::min(count - done, kMaxMpiCount);
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, at(data, done, bytes),
                                            to_mpi_count(piece), to_mpi_type(dtype), to_mpi_op(op),
                                            comm_.get()));
    done += piece;
  }
  return Status();
}

Status MpiBackend::allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                              DataType dtype) {
  TUTTI_CHECK(counts.size() == static_cast<std::size_t>(size()),
              "allgatherv needs one count per rank");
  const IntLayout layout = int_layout(counts);
  // Every rank sends from its own buffer; MPI_IN_PLACE would need the input inside `output`.
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Allgatherv(input, layout.counts[rank()], to_mpi_type(dtype), output,
                                           layout.counts.data(), layout.displacements.data(),
                                           to_mpi_type(dtype), comm_.get()));
  return Status();
}

Status MpiBackend::broadcast(void* data, std::size_t count, DataType dtype, int root) {
  const std::size_t bytes = element_size(dtype);
  for (std::size_t done = 0; done < count;) {
    const std::size_t piece = std::min(count - done, kMaxMpiCount);
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Bcast(at(data, done, bytes), to_mpi_count(piece),
                                        to_mpi_type(dtype), root, comm_.get()));
    done += piece;
  }
  return Status();
}

Status MpiBackend::alltoallv(const void* input, std::span<const std::size_t> send_counts,
                             void* output, std::span<const std::size_t> recv_counts,
                             DataType dtype) {
  const IntLayout send = int_layout(send_counts);
  const IntLayout recv = int_layout(recv_counts);
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Alltoallv(
      input, send.counts.data(), send.displacements.data(), to_mpi_type(dtype), output,
      recv.counts.data(), recv.displacements.data(), to_mpi_type(dtype), comm_.get()));
  return Status();
}

Status MpiBackend::reducescatter(const void* input, void* output,
                                 std::span<const std::size_t> recv_counts, DataType dtype,
                                 WireOp op) {
  const IntLayout layout = int_layout(recv_counts);
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Reduce_scatter(input, output, layout.counts.data(),
                                               to_mpi_type(dtype), to_mpi_op(op), comm_.get()));
  return Status();
}

Status MpiBackend::barrier() {
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Barrier(comm_.get()));
  return Status();
}

Status MpiBackend::adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) {
  return adasum_allreduce(comm_.get(), data, tensor_counts, dtype);
}

}  // namespace tutti::ops::mpi
