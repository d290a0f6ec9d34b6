// SPDX-License-Identifier: Apache-2.0
// The CPU backend: every collective is the matching MPI call on the set's communicator,
// split into pieces of at most max_mpi_count() elements where int counts cannot describe the
// layout (allgatherv, alltoallv, reduce_scatter, gatherv, scatterv and Adasum then run per
// rank or pairwise).
#pragma once

#include "ops/backend.h"
#include "ops/mpi/mpi_comm.h"

namespace tutti::ops::mpi {

class MpiBackend final : public Backend {
 public:
  // Owns `comm`. Communication thread only.
  explicit MpiBackend(MpiComm comm) : comm_(std::move(comm)) {}

  std::string_view name() const override { return "MPI"; }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  Status allreduce(void* data, std::size_t count, DataType dtype, WireOp op) override;
  Status allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                    DataType dtype) override;
  Status broadcast(void* data, std::size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* input, std::span<const std::size_t> send_counts, void* output,
                   std::span<const std::size_t> recv_counts, DataType dtype) override;
  Status reducescatter(const void* input, void* output, std::span<const std::size_t> recv_counts,
                       DataType dtype, WireOp op) override;
  Status barrier() override;
  Status reduce(const void* input, void* output, std::size_t count, DataType dtype, WireOp op,
                int root) override;
  Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                 DataType dtype, int root) override;
  Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                  DataType dtype, int root) override;
  Status adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) override;

 private:
  MpiComm comm_;
};

}  // namespace tutti::ops::mpi
