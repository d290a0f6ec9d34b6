// SPDX-License-Identifier: Apache-2.0
// The data-moving interface core runs collectives through. One Backend per process set and
// device kind; every call is collective over the set, blocking, and made on the communication
// thread in the same order on every member (core guarantees that order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "src/common/status.h"
#include "tutti/collectives.h"
#include "tutti/tensor.h"

namespace tutti::ops {

// Which reduction the transport applies. Average and scale factors are core's business: it
// sends Sum and scales around the call, so every backend averages alike.
enum class WireOp : std::uint8_t { Sum, Min, Max, Product };

// One tensor of a fused reduction (Backend::allreduce_tensors): `count` elements read from
// `input` as `input_type`, times `prescale` (zeros when `input` is null: a joined rank), are
// reduced in the wire dtype and written to `output` as `output_type`, times `factor` (dropped
// when `output` is null). `output` may equal `input`; tensors do not otherwise overlap.
struct FusedTensor {
  const void* input = nullptr;
  DataType input_type = DataType::Float32;
  double prescale = 1.0;
  void* output = nullptr;
  DataType output_type = DataType::Float32;
  double factor = 1.0;
  std::size_t count = 0;
};

// Which host transport each size class of collective takes: bit k set = the collectives of
// host_size_class() k go over MPI rather than shared memory. 0: all over shared memory.
using HostRoutes = std::uint8_t;
// The size classes: up to kSmallHostBytes moved in total (class 0), and larger (class 1).
inline constexpr int kHostSizeClasses = 2;
inline constexpr std::size_t kSmallHostBytes = std::size_t{64} << 10;
inline constexpr HostRoutes kAllHostRoutes = (1u << kHostSizeClasses) - 1;
inline int host_size_class(std::size_t bytes) { return bytes <= kSmallHostBytes ? 0 : 1; }

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;  // In the set.
  virtual int size() const = 0;

  // In place over `count` elements. dtype is any DataType except Float16/BFloat16 (core
  // widens those to Float32); Bool only with Min/Max.
  virtual Status allreduce(void* data, std::size_t count, DataType dtype, WireOp op) = 0;
  // Every rank's `input` (counts[rank] elements) concatenated in rank order into `output`.
  virtual Status allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                            DataType dtype) = 0;
  // The root's `data` into every member's `data`. `root` is a set rank.
  virtual Status broadcast(void* data, std::size_t count, DataType dtype, int root) = 0;
  // send_counts[i] elements from `input` (in order) to rank i; recv_counts[i] from rank i into
  // `output` (in order).
  virtual Status alltoallv(const void* input, std::span<const std::size_t> send_counts,
                           void* output, std::span<const std::size_t> recv_counts,
                           DataType dtype) = 0;
  // Sums `input` over the set; rank i receives recv_counts[i] elements (consecutive blocks
  // of `input` in rank order) into `output`.
  virtual Status reducescatter(const void* input, void* output,
                               std::span<const std::size_t> recv_counts, DataType dtype,
                               WireOp op) = 0;
  virtual Status barrier() = 0;
  // The rooted collectives: only the root receives (reduce, gatherv) or sends (scatterv);
  // `root` is a set rank. No member receives more than its own result.
  // reduce: every member's `input` (`count` elements) reduced with `op` into the root's
  // `output`, which may equal its `input` (in place); elsewhere `output` is ignored (may be
  // null) and `input` is only read. dtypes as allreduce.
  virtual Status reduce(const void* input, void* output, std::size_t count, DataType dtype,
                        WireOp op, int root) = 0;
  // gatherv: every member's `input` (counts[rank] elements) concatenated in rank order into
  // the root's `output`; elsewhere `output` is ignored.
  virtual Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                         DataType dtype, int root) = 0;
  // scatterv: the root's `input`, counts[i] consecutive elements to member i (in order), each
  // into that member's `output`; elsewhere `input` is ignored.
  virtual Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                          DataType dtype, int root) = 0;
  // Whether allreduce_tensors() and reduce_tensors() take a reduction of `wire_bytes` in total:
  // backends that reduce straight from the tensors (shared memory) spare core the pack into a
  // fusion buffer and the unpack from it. Pure and rank-independent, like every choice of the
  // wire.
  virtual bool reduces_tensors(std::size_t /*wire_bytes*/) const { return false; }
  // Reduces `tensors` as one fused allreduce in `wire` (any dtype allreduce takes) with `op`,
  // converting and scaling on the way in and out (see FusedTensor). Only where
  // reduces_tensors() said yes.
  virtual Status allreduce_tensors(std::span<const FusedTensor> /*tensors*/, DataType /*wire*/,
                                   WireOp /*op*/) {
    return Status(ErrorCode::Internal, "this backend does not reduce tensors directly");
  }
  // As allreduce_tensors(), but only the root's outputs receive the result (the others'
  // `output` fields are null); `root` is a set rank.
  virtual Status reduce_tensors(std::span<const FusedTensor> /*tensors*/, DataType /*wire*/,
                                WireOp /*op*/, int /*root*/) {
    return Status(ErrorCode::Internal, "this backend does not reduce tensors directly");
  }
  // Adasum (adaptive summation) of `data` in place: consecutive tensors of tensor_counts[i]
  // elements, each combined with its own coefficients. dtype is Float32 or Float64 (core
  // widens Float16/BFloat16); the set size is a power of two (checked at the call). Not pure,
  // so that backends without it (test fakes) still build: they refuse it.
  virtual Status adasum(void* /*data*/, std::span<const std::size_t> /*tensor_counts*/,
                        DataType /*dtype*/) {
    return Status(ErrorCode::InvalidArgument, "ADASUM is not supported by this backend");
  }
  // Whether route_host() changes anything here: the backend carries some collectives over
  // either shared memory or MPI (ShmBackend, or a HierarchicalBackend over one).
  virtual bool routes_host() const { return false; }
  // From the next call on, collectives of each host size class whose bit is set in `over_mpi`
  // go over MPI instead of shared memory; the autotuner chooses (Note [Host transport by size]
  // in ops/shm/shm_backend.h). A collective decision: every member sets the same value between
  // the same two calls. Backends without the choice ignore it.
  virtual void route_host(HostRoutes /*over_mpi*/) {}
  // Device backends return once their work is enqueued on a stream (see Note [Stream
  // ordering] in ops/cuda/stream.h); this is an error found since, without blocking: a peer
  // lost mid-collective, after which the op's completion event would never complete. Core asks
  // while it polls a device op's event. Host backends finish inside each call: always OK.
  virtual Status async_error() { return Status(); }
  // After the job stopped on an error a peer may never enter a collective again: drops what
  // only a collective call could free (kept until the process exits), so that destroying the
  // backend cannot wait for that peer. Communication thread, or the thread ending the session.
  virtual void abandon() {}
};

}  // namespace tutti::ops
