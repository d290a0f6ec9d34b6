// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/mpi_backend.h"

#include <algorithm>
#include <vector>

#include "ops/fault_injection.h"
#include "ops/mpi/adasum.h"
#include "ops/mpi/mpi_error.h"
#include "ops/mpi/mpi_pieces.h"
#include "ops/mpi/mpi_types.h"
#include "src/common/check.h"

namespace tutti::ops::mpi {
namespace {

std::byte* at(void* base, std::size_t elements, std::size_t element_bytes) {
  return static_cast<std::byte*>(base) + elements * element_bytes;
}
const std::byte* at(const void* base, std::size_t elements, std::size_t element_bytes) {
  return static_cast<const std::byte*>(base) + elements * element_bytes;
}

// Counts and displacements for the v-collectives, which take int.
struct IntLayout {
  std::vector<int> counts;
  std::vector<int> displacements;
};

// Tag of the point-to-point pieces of the large-layout fallbacks (data communicator only).
constexpr int kPiecesTag = 0x7e55;

std::size_t total(std::span<const std::size_t> counts) {
  std::size_t sum = 0;
  for (std::size_t count : counts) sum += count;
  return sum;
}

// Whether int counts and displacements can describe `counts` laid out back to back.
bool fits_one_call(std::span<const std::size_t> counts) { return total(counts) <= max_mpi_count(); }

std::vector<std::size_t> offsets(std::span<const std::size_t> counts) {
  std::vector<std::size_t> result;
  std::size_t offset = 0;
  for (std::size_t count : counts) {
    result.push_back(offset);
    offset += count;
  }
  return result;
}

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

// Note [MPICH's in-place reduce]
// MPICH 4.0 and 4.1 (Debian 12 ships 4.0.2) crash in MPI_Reduce when a root other than 0 passes
// MPI_IN_PLACE with two processes on one host (a memcpy from a bad address in its
// reduce-scatter-gather algorithm; pmodels/mpich issue 6540, fixed after 4.1.1). Open MPI has no
// such bug, so only an MPICH build pays for the root's copy of its input.
bool in_place_reduce_works(int root) {
#ifdef MPICH_VERSION
  return root == 0;
#else
  (void)root;
  return true;
#endif
}

}  // namespace

Status MpiBackend::allreduce(void* data, std::size_t count, DataType dtype, WireOp op) {
  TUTTI_RETURN_IF_ERROR(take_allreduce_fault());
  const std::size_t bytes = element_size(dtype);
  for (std::size_t done = 0; done < count;) {
    const std::size_t piece = std::min(count - done, max_mpi_count());
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
  if (!fits_one_call(counts)) {
    // Past int's range: each rank's block is broadcast from it, in pieces.
    const std::vector<std::size_t> at_offset = offsets(counts);
    const std::size_t bytes = element_size(dtype);
    const std::size_t me = static_cast<std::size_t>(rank());
    std::copy_n(static_cast<const std::byte*>(input), counts[me] * bytes,
                at(output, at_offset[me], bytes));
    for (int root = 0; root < size(); ++root) {
      const std::size_t r = static_cast<std::size_t>(root);
      TUTTI_RETURN_IF_ERROR(broadcast(at(output, at_offset[r], bytes), counts[r], dtype, root));
    }
    return Status();
  }
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
    const std::size_t piece = std::min(count - done, max_mpi_count());
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Bcast(at(data, done, bytes), to_mpi_count(piece),
                                        to_mpi_type(dtype), root, comm_.get()));
    done += piece;
  }
  return Status();
}

Status MpiBackend::alltoallv(const void* input, std::span<const std::size_t> send_counts,
                             void* output, std::span<const std::size_t> recv_counts,
                             DataType dtype) {
  // Each rank knows only its own counts, and every rank must take the same path: one flag
  // allreduce decides (a few microseconds; alltoall is not latency-bound).
  int too_large = !fits_one_call(send_counts) || !fits_one_call(recv_counts) ? 1 : 0;
  TUTTI_MPI_RETURN_IF_ERROR(
      MPI_Allreduce(MPI_IN_PLACE, &too_large, 1, MPI_INT, MPI_MAX, comm_.get()));
  if (too_large != 0) {
    // Past int's range: a pairwise exchange, step k sending to rank + k and receiving from
    // rank - k, each block in pieces.
    const std::vector<std::size_t> send_at = offsets(send_counts);
    const std::vector<std::size_t> recv_at = offsets(recv_counts);
    const std::size_t bytes = element_size(dtype);
    void* send_base = const_cast<void*>(input);  // Only read.
    for (int k = 0; k < size(); ++k) {
      const int to = (rank() + k) % size();
      const int from = (rank() - k + size()) % size();
      const std::size_t t = static_cast<std::size_t>(to);
      const std::size_t f = static_cast<std::size_t>(from);
      TUTTI_RETURN_IF_ERROR(exchange_in_pieces(at(send_base, send_at[t], bytes), send_counts[t], to,
                                               at(output, recv_at[f], bytes), recv_counts[f], from,
                                               to_mpi_type(dtype), bytes, kPiecesTag, comm_.get()));
    }
    return Status();
  }
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
  if (!fits_one_call(recv_counts)) {
    // Past int's range: block r is reduced onto rank r, in pieces.
    const std::vector<std::size_t> block_at = offsets(recv_counts);
    const std::size_t bytes = element_size(dtype);
    void* input_base = const_cast<void*>(input);  // Only read.
    for (int root = 0; root < size(); ++root) {
      const std::size_t r = static_cast<std::size_t>(root);
      for (std::size_t done = 0; done < recv_counts[r];) {
        const std::size_t piece = std::min(recv_counts[r] - done, max_mpi_count());
        TUTTI_MPI_RETURN_IF_ERROR(MPI_Reduce(at(input_base, block_at[r] + done, bytes),
                                             at(output, done, bytes), to_mpi_count(piece),
                                             to_mpi_type(dtype), to_mpi_op(op), root, comm_.get()));
        done += piece;
      }
    }
    return Status();
  }
  const IntLayout layout = int_layout(recv_counts);
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Reduce_scatter(input, output, layout.counts.data(),
                                               to_mpi_type(dtype), to_mpi_op(op), comm_.get()));
  return Status();
}

Status MpiBackend::reduce(const void* input, void* output, std::size_t count, DataType dtype,
                          WireOp op, int root) {
  const std::size_t bytes = element_size(dtype);
  const bool is_root = rank() == root;
  // See Note [MPICH's in-place reduce]: there the root reduces from a copy of its input.
  const bool copy_root_input = is_root && input == output && !in_place_reduce_works(root);
  std::vector<std::byte> root_input;
  for (std::size_t done = 0; done < count;) {
    const std::size_t piece = std::min(count - done, max_mpi_count());
    const void* send = at(input, done, bytes);
    if (copy_root_input) {
      root_input.assign(at(input, done, bytes), at(input, done + piece, bytes));
      send = root_input.data();
    } else if (is_root && input == output) {
      send = MPI_IN_PLACE;
    }
    void* receive = is_root ? at(output, done, bytes) : nullptr;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Reduce(send, receive, to_mpi_count(piece), to_mpi_type(dtype),
                                         to_mpi_op(op), root, comm_.get()));
    done += piece;
  }
  return Status();
}

Status MpiBackend::gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                           DataType dtype, int root) {
  TUTTI_CHECK(counts.size() == static_cast<std::size_t>(size()),
              "gatherv needs one count per rank");
  const std::size_t me = static_cast<std::size_t>(rank());
  const std::size_t bytes = element_size(dtype);
  if (!fits_one_call(counts)) {
    // Past int's range: every block travels to the root point to point, in pieces. Every
    // rank holds the same counts, so every rank takes this path.
    if (rank() != root) {
      return exchange_in_pieces(input, counts[me], root, nullptr, 0, root, to_mpi_type(dtype),
                                bytes, kPiecesTag, comm_.get());
    }
    const std::vector<std::size_t> at_offset = offsets(counts);
    std::copy_n(static_cast<const std::byte*>(input), counts[me] * bytes,
                at(output, at_offset[me], bytes));
    for (int from = 0; from < size(); ++from) {
      const std::size_t f = static_cast<std::size_t>(from);
      if (from == root) continue;
      TUTTI_RETURN_IF_ERROR(exchange_in_pieces(nullptr, 0, from, at(output, at_offset[f], bytes),
                                               counts[f], from, to_mpi_type(dtype), bytes,
                                               kPiecesTag, comm_.get()));
    }
    return Status();
  }
  const IntLayout layout = int_layout(counts);
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Gatherv(input, layout.counts[me], to_mpi_type(dtype), output,
                                        layout.counts.data(), layout.displacements.data(),
                                        to_mpi_type(dtype), root, comm_.get()));
  return Status();
}

Status MpiBackend::scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                            DataType dtype, int root) {
  TUTTI_CHECK(counts.size() == static_cast<std::size_t>(size()),
              "scatterv needs one count per rank");
  const std::size_t me = static_cast<std::size_t>(rank());
  const std::size_t bytes = element_size(dtype);
  if (!fits_one_call(counts)) {
    // Past int's range: the root sends every block point to point, in pieces.
    if (rank() != root) {
      return exchange_in_pieces(nullptr, 0, root, output, counts[me], root, to_mpi_type(dtype),
                                bytes, kPiecesTag, comm_.get());
    }
    const std::vector<std::size_t> at_offset = offsets(counts);
    std::copy_n(at(input, at_offset[me], bytes), counts[me] * bytes,
                static_cast<std::byte*>(output));
    for (int to = 0; to < size(); ++to) {
      const std::size_t t = static_cast<std::size_t>(to);
      if (to == root) continue;
      TUTTI_RETURN_IF_ERROR(exchange_in_pieces(at(input, at_offset[t], bytes), counts[t], to,
                                               nullptr, 0, to, to_mpi_type(dtype), bytes,
                                               kPiecesTag, comm_.get()));
    }
    return Status();
  }
  const IntLayout layout = int_layout(counts);
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Scatterv(input, layout.counts.data(), layout.displacements.data(),
                                         to_mpi_type(dtype), output, layout.counts[me],
                                         to_mpi_type(dtype), root, comm_.get()));
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
