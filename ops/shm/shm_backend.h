// SPDX-License-Identifier: Apache-2.0
// Collectives among ranks that share a host, through shared memory (Note [Shared-memory ring]
// in ops/shm/shm_ring.h): allreduce and reduce (packing, conversion and scaling fused into the
// chunked reduction: allreduce_tensors, reduce_tensors), allgatherv, gatherv, scatterv,
// broadcast and reducescatter. The set's MPI backend runs the rest (alltoallv, barrier,
// Adasum). See Note [Which host transport].
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/backend.h"
#include "ops/mpi/mpi_comm.h"
#include "ops/shm/shm_ring.h"
#include "ops/shm/staging.h"
#include "ops/transport.h"

namespace tutti::ops::shm {

// Note [Which host transport]
// TUTTI_HOST_TRANSPORT picks, per set whose ranks all share a host: `mpi` always MPI; `shm` and
// `auto` (the default) shared memory for every collective it has. Measured at 2 ranks
// (allreduce_benchmark --sweep-sizes; examples/BENCHMARK_LOG.md), shared memory is as fast as MPI
// up to a few KB (both are dominated by negotiation; small allreduces take a one-round path, see
// allreduce_tensors) and faster above (each peer's byte is read once, where MPI's transport
// copies it through its FIFOs). It also waits without open-ended busy-polling (a bounded spin,
// then yields: wait_until() in shm_ring.cc): MPI's blocking collectives spin on a core, which
// during an overlapped backward pass is the compute thread's (P9: ~30% slower steps on MPI). With
// more ranks than cores a tiny op's latency is somewhat higher on shared memory than on MPI (which
// yields when oversubscribed); `auto` still starts on shared memory, since a fixed size rule
// would have to guess the machine: under TUTTI_AUTOTUNE the job measures instead (next Note).
//
// Note [Host transport by size]
// Which transport is faster depends on the machine and the size (on a 2-core AMD VM MPI was
// ahead for single 16 and 64 MiB tensors, shared memory at 64 KiB), so a ShmBackend can send
// each of two size classes of collective (ops::host_size_class: up to 64 KiB moved in total,
// and larger) over the set's MPI backend instead: route_host(). The size is the bytes the
// whole collective moves (every rank's blocks for the gathers), so it is the same on every
// rank, and routes change only between response lists, on every rank at the same list, so
// every rank takes the same transport for every collective. The autotuner chooses the routes
// (Note [Autotune] in src/core/tuning/autotune.h, step 3); TUTTI_HOST_TRANSPORT=shm/mpi or
// =mpi/shm fixes them. A fused reduction routed to MPI is packed by core as for any MPI set
// (reduces_tensors() says no for that class).

class ShmBackend final : public Backend {
 public:
  // `mpi` is the set's MPI backend; `ring` is over the same communicator; `stores` how this
  // rank stages chunks (Note [Streaming stores] in ops/shm/staging.h). Communication thread only.
  ShmBackend(std::unique_ptr<Backend> mpi, std::unique_ptr<ShmRing> ring,
             ShmStores stores = ShmStores::Auto)
      : mpi_(std::move(mpi)), ring_(std::move(ring)) {
    staging_.fill(StagingChoice(stores));
    // Every rank chooses from host rank 0's costs (Note [Streaming stores]).
    static_assert(kFamilies * StagingChoice::kBoardWords <= ShmRing::kBoardWords);
    for (std::size_t f = 0; f < kFamilies; ++f) {
      staging_[f].share(ring_->board(0) + f * StagingChoice::kBoardWords, ring_->rank() == 0);
    }
  }

  std::string_view name() const override { return "shared memory"; }
  int rank() const override { return ring_->rank(); }
  int size() const override { return ring_->size(); }
  Status allreduce(void* data, std::size_t count, DataType dtype, WireOp op) override;
  bool reduces_tensors(std::size_t wire_bytes) const override { return !over_mpi(wire_bytes); }
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
  Status reduce(const void* input, void* output, std::size_t count, DataType dtype, WireOp op,
                int root) override;
  Status reduce_tensors(std::span<const FusedTensor> tensors, DataType wire, WireOp op,
                        int root) override;
  Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                 DataType dtype, int root) override;
  Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                  DataType dtype, int root) override;
  Status adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) override {
    return mpi_->adasum(data, tensor_counts, dtype);
  }
  void abandon() override { ring_->abandon(); }
  bool routes_host() const override { return true; }
  // The ring chunks collectives have used: what tells a test which transport ran.
  std::uint64_t chunks_taken() const { return ring_->chunks_taken(); }
  // The collectives this rank staged with streaming stores: what tells a test which stores ran.
  std::uint64_t streamed() const;
  // Measured reductions whose cost this rank took from its own measurement, not host rank 0's
  // (Note [Streaming stores]): what tells a test that the ranks share one choice.
  std::uint64_t reductions_own_costs() const { return staging_[kReduce].own_costs(); }
  void route_host(HostRoutes over_mpi) override { over_mpi_ = over_mpi & kAllHostRoutes; }

 private:
  // Whether a collective moving `bytes` in total goes over mpi_ (route_host()).
  bool over_mpi(std::size_t bytes) const { return (over_mpi_ >> host_size_class(bytes)) & 1u; }

  // allreduce_tensors (root -1: every rank receives) and reduce_tensors (the root alone).
  Status reduce_chunks(std::span<const FusedTensor> tensors, DataType wire, WireOp op, int root);

  // The collective families, each with its own choice of stores: their costs per byte differ.
  // A gather to a root is apart from allgather: its other ranks read no slot, so host rank 0's
  // costs need not have reached them (Note [Streaming stores]), and ranks that choose apart there
  // must not take allgather's choice apart with them.
  enum Family { kReduce, kGather, kRootedGather, kBroadcast, kScatter, kReduceScatter, kFamilies };

  std::unique_ptr<Backend> mpi_;
  std::unique_ptr<ShmRing> ring_;     // Destroyed first: its window lives on mpi_'s communicator.
  std::vector<const void*> sources_;  // Reused by every reduction: no allocation per op.
  std::vector<std::byte> scratch_;    // Small allreduces' result (see allreduce_tensors).
  HostRoutes over_mpi_ = 0;           // Size classes that go over mpi_.
  std::array<StagingChoice, kFamilies> staging_;
};

// The host backend of a set over `comm`: a ShmBackend when `options.host_transport` allows it,
// the set has several ranks and all of them share a host; else the MPI backend. Collective
// over `comm`.
Result<std::unique_ptr<Backend>> create_host_backend(mpi::MpiComm comm,
                                                     const BackendOptions& options);

}  // namespace tutti::ops::shm
