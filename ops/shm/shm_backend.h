// SPDX-License-Identifier: Apache-2.0
// Collectives among ranks that share a host, through shared memory (Note [Shared-memory ring]
// in ops/shm/shm_ring.h): allreduce (packing, conversion and scaling fused into the chunked
// reduction: allreduce_tensors), allgatherv, broadcast and reducescatter. The set's MPI
// backend runs the rest (alltoallv, barrier, Adasum) and the sizes where MPI is faster (Note
// [Which host transport]).
#pragma once

#include <cstddef>
#include <memory>

#include "ops/backend.h"
#include "ops/mpi/mpi_comm.h"
#include "ops/shm/shm_ring.h"
#include "ops/transport.h"

namespace tutti::ops::shm {

// Note [Which host transport]
// TUTTI_HOST_TRANSPORT picks, per set whose ranks all share a host: `mpi` always MPI, `shm`
// shared memory for every collective it has, `auto` shared memory for collectives of at least
// kAutoMinBytes. The choice depends only on the op's size, which every rank knows alike, so
// all ranks of a set pick the same transport for every op. Below kAutoMinBytes the
// two are equally fast on the machines measured (a few microseconds, dominated by negotiation);
// above it shared memory reads each peer's data once, where MPI's shared-memory transport
// copies it through its FIFOs (figures in README "Benchmarks").
struct ShmPolicy {
  std::size_t min_bytes = 0;  // Smaller collectives go to MPI.
};
ShmPolicy policy_for(HostTransport transport);

class ShmBackend final : public Backend {
 public:
  // `mpi` is the set's MPI backend; `ring` is over the same communicator. Communication
  // thread only.
  ShmBackend(std::unique_ptr<Backend> mpi, std::unique_ptr<ShmRing> ring, ShmPolicy policy)
      : mpi_(std::move(mpi)), ring_(std::move(ring)), policy_(policy) {}

  std::string_view name() const override { return "shared memory"; }
  int rank() const override { return ring_->rank(); }
  int size() const override { return ring_->size(); }
  Status allreduce(void* data, std::size_t count, DataType dtype, WireOp op) override;
  bool reduces_tensors(std::size_t wire_bytes) const override { return uses_shm(wire_bytes); }
  Status allreduce_tensors(std::span<const FusedTensor> tensors, DataType wire, WireOp op) override;
  Status allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                    DataType dtype) override;
  Status broadcast(void* data, std::size_t count, DataType dtype, int root) override;
  Status alltoallv(const void* input, std::span<const std::size_t> send_counts, void* output,
                   std::span<const std::size_t> recv_counts, DataType dtype) override {
    return mpi_->alltoallv(input, send_counts, output, recv_counts, dtype);
  }
  Status reducescatter(const void* input, void* output, std::span<const std::size_t> recv_counts,
                       DataType dtype, WireOp op) override;
  Status barrier() override { return mpi_->barrier(); }
  Status adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) override {
    return mpi_->adasum(data, tensor_counts, dtype);
  }
  void abandon() override { ring_->abandon(); }

 private:
  bool uses_shm(std::size_t bytes) const { return bytes >= policy_.min_bytes; }

  std::unique_ptr<Backend> mpi_;
  std::unique_ptr<ShmRing> ring_;  // Destroyed first: its window lives on mpi_'s communicator.
  ShmPolicy policy_;
};

// The host backend of a set over `comm`: a ShmBackend when `transport` allows it, the set has
// several ranks and all of them share a host; else the MPI backend. Collective over `comm`.
Result<std::unique_ptr<Backend>> create_host_backend(mpi::MpiComm comm, HostTransport transport);

}  // namespace tutti::ops::shm
