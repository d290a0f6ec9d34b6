// SPDX-License-Identifier: Apache-2.0
// The NCCL backend: collectives over CUDA buffers on Tutti's stream of one device, with a
// communicator per (process set, stream) created on first use.
#pragma once

#include <memory>

#include <cuda_runtime.h>
#include <nccl.h>

#include "ops/backend.h"
#include "ops/device_ops.h"
#include "ops/nccl/nccl_comm.h"

namespace tutti::ops::nccl {

// Communication thread only; calls are collective over the set, in the same order on every
// member. Every call returns once its work is ENQUEUED on `stream` (Note [Stream ordering] in
// ops/cuda/stream.h): the result is in the buffer when an event recorded on the stream after
// the call completes (DeviceOps::record_event). Buffers are device memory of the stream's
// device and must stay valid until then.
//
// dtypes: every DataType. Data movement (allgatherv, gatherv, scatterv, broadcast, alltoallv)
// moves bytes.
// Reductions use NCCL's own types, Float16 and BFloat16 included (NCCL accumulates those in
// their own precision; core widens to Float32 when API.md's float32 reduction is wanted).
// NCCL has no 16-bit integers: Int16/UInt16 are reduced in Int32 in a scratch buffer and
// narrowed back keeping the low bits, which equals 16-bit arithmetic. Bool reduces with Min
// and Max only (as ncclUint8). Adasum is refused.
class NcclBackend final : public Backend {
 public:
  // Collective over `bootstrap`'s set (the set's MPI backend; used only during this call):
  // creates the communicator for `stream.device` and binds it to `stream`.
  static Result<std::unique_ptr<NcclBackend>> create(Backend& bootstrap, DeviceStream stream);

  std::string_view name() const override { return "NCCL"; }
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
  // A one-element allreduce: complete when its event is.
  Status barrier() override;
  // ncclReduce; gatherv and scatterv are grouped ncclSend/ncclRecv with the root (bytes).
  Status reduce(const void* input, void* output, std::size_t count, DataType dtype, WireOp op,
                int root) override;
  Status gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                 DataType dtype, int root) override;
  Status scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                  DataType dtype, int root) override;
  Status adasum(void* data, std::span<const std::size_t> tensor_counts, DataType dtype) override;
  Status async_error() override { return comm_.async_error(); }

  DeviceStream stream() const { return stream_; }

 private:
  NcclBackend(NcclComm comm, DeviceStream stream, cudaStream_t native)
      : comm_(std::move(comm)), stream_(stream), native_(native) {}

  // Device scratch of at least `bytes`, ordered on the stream (growth frees the old one with
  // cudaFreeAsync, after the work that used it).
  Result<std::byte*> scratch(std::size_t bytes);
  // Int16/UInt16 `count` elements at `source` into Int32 at `wide` (or back, wrapping).
  Status widen(const void* source, DataType dtype, std::int32_t* wide, std::size_t count);
  Status narrow(const std::int32_t* wide, void* destination, DataType dtype, std::size_t count);
  enum class Direction { Gather, Scatter };
  // gatherv and scatterv, which mirror each other: the root receives (Gather) or sends
  // (Scatter) every other rank's block of `blocks`, at the offsets `counts` give, in one NCCL
  // group, and copies its own block between `blocks` and `mine_at`; a member sends or receives
  // its block at `mine_at`. `blocks` is only read when scattering, `mine_at` only when gathering.
  Status rooted_blocks(Direction direction, void* blocks, void* mine_at,
                       std::span<const std::size_t> counts, DataType dtype, int root);
  Status reduce_scatter_native(const void* input, void* output,
                               std::span<const std::size_t> recv_counts, ncclDataType_t type,
                               std::size_t element, ncclRedOp_t op);

  NcclComm comm_;
  DeviceStream stream_;
  cudaStream_t native_;
  std::shared_ptr<void> scratch_;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace tutti::ops::nccl
