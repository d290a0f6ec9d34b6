// SPDX-License-Identifier: Apache-2.0
// Hierarchical collectives for a process set that spans several hosts with the same number of
// members on each, composed of three backends of the same set: one over all members, one over
// this host's members, one over the members with this rank's local index (one per host).
//
// Note [Hierarchical schedules]
// With H hosts of L members each (set rank r on host h(r) at local index l(r)):
//  allreduce of n elements: the n elements are cut into L slices (split_evenly); an intra-host
//    reduce-scatter leaves slice l, reduced over the host, on local index l; local index l of
//    every host then allreduces slice l across hosts (the cross backends run side by side, each
//    moving n/L elements between hosts instead of n); an intra-host allgather puts the slices
//    back together on every member. Each slice is reduced once, by one cross backend, and then
//    copied, so every member ends with the same bits.
//  allgatherv: an intra-host allgather builds the host's block (its members' inputs in
//    set-rank order); local index 0 of every host allgathers the blocks across hosts; an
//    intra-host broadcast hands the result to the host's other members, who then hold every
//    block in host order. When hosts hold consecutive set ranks that is set-rank order and the
//    result lands straight in the output; otherwise it goes through scratch memory and each
//    member's rows are copied to their place.
// Everything else (broadcast, alltoallv, reducescatter, the rooted reduce, gatherv and
// scatterv, barrier, Adasum, and allreduce or allgatherv below their threshold) runs on the
// backend over all members. Which path an op
// takes depends only on its byte size and the thresholds, which every member holds alike
// (set from the agreed knobs, or from measurements every member shares: calibration.h).
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <vector>

#include "ops/backend.h"
#include "ops/hierarchical/host_layout.h"

namespace tutti::ops::hierarchical {

// Communication thread only, like every Backend.
class HierarchicalBackend final : public Backend {
 public:
  struct Parts {
    std::unique_ptr<Backend> flat;   // Every member of the set, in set-rank order.
    std::unique_ptr<Backend> local;  // This host's members, rank = local index.
    std::unique_ptr<Backend> cross;  // Members with this local index, rank = host index.
  };
  // From which buffer size (count x element size, in bytes) allreduce and allgatherv (the
  // gathered total) run hierarchically: 0 = always, kNever = never.
  struct Thresholds {
    std::size_t allreduce_bytes = 0;
    std::size_t allgather_bytes = 0;
  };
  static constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();

  // `layout.hierarchical()` must hold and the parts' ranks and sizes must match it (checked:
  // a mismatch is a bug in the caller).
  HierarchicalBackend(Parts parts, HostLayout layout, Thresholds thresholds);

  const Thresholds& thresholds() const { return thresholds_; }
  // Collective decisions only: every member must set the same thresholds at the same point.
  void set_thresholds(const Thresholds& thresholds) { thresholds_ = thresholds; }
  // The backend over all members, which the flat path uses.
  Backend& flat() { return *flat_; }
  const HostLayout& layout() const { return layout_; }

  std::string_view name() const override { return "MPI, hierarchical"; }
  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  Status allreduce(void* data, std::size_t count, DataType dtype, WireOp op) override;
  Status allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                    DataType dtype) override;
  Status broadcast(void* data, std::size_t count, DataType dtype, int root) override {
    return flat_->broadcast(data, count, dtype, root);
  }
  Status alltoallv(const void* input, std::span<const std::size_t> send_counts, void* output,
                   std::span<const std::size_t> recv_counts, DataType dtype) override {
    return flat_->alltoallv(input, send_counts, output, recv_counts, dtype);
  }
  Status reducescatter(const void* input, void* output, std::span<const std::size_t> recv_counts,
                       DataType dtype, WireOp op) override {
    return flat_->reducescatter(input, output, recv_counts, dtype, op);
  }
  Status barrier() override { return flat_->barrier(); }
  Status reduce(const void* input, void* output, std::size_t count, DataType dtype, WireOp op,
                int root) override {
    return flat_->reduce(input, output, count, dtype, op, root);
  }
  Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                 DataType dtype, int root) override {
    return flat_->gatherv(input, output, counts, dtype, root);
  }
  Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                  DataType dtype, int root) override {
    return flat_->scatterv(input, counts, output, dtype, root);
  }
  Status adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) override {
    return flat_->adasum(data, tensor_counts, dtype);
  }
  Status async_error() override { return flat_->async_error(); }
  // Reduces from a fusion buffer only (reduces_tensors stays false): core packs, then
  // allreduce() runs the schedule.
  void abandon() override {
    flat_->abandon();
    local_->abandon();
    cross_->abandon();
  }
  // The host transport is chosen within each host (the local part); the other parts are MPI.
  bool routes_host() const override { return local_->routes_host(); }
  void route_host(HostRoutes over_mpi) override { local_->route_host(over_mpi); }
  // The intra-host backend's name, for logs ("shared memory", "MPI").
  std::string_view local_name() const { return local_->name(); }

 private:
  // At least `bytes` of scratch memory, kept for later calls.
  std::byte* scratch(std::size_t bytes);

  std::unique_ptr<Backend> flat_;
  std::unique_ptr<Backend> local_;
  std::unique_ptr<Backend> cross_;
  const HostLayout layout_;
  Thresholds thresholds_;
  std::vector<std::byte> scratch_;
};

}  // namespace tutti::ops::hierarchical
