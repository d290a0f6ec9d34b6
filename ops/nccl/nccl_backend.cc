// SPDX-License-Identifier: Apache-2.0
#include "ops/nccl/nccl_backend.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>

#include "ops/cuda/cuda_error.h"
#include "ops/cuda/device_ops.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/stream.h"
#include "ops/nccl/nccl_error.h"
#include "src/common/check.h"

namespace tutti::ops::nccl {
namespace {

// NCCL's type for a reduction over `dtype`; none for 16-bit integers (reduced widened).
std::optional<ncclDataType_t> to_nccl_type(DataType dtype) {
  switch (dtype) {
    case DataType::UInt8: return ncclUint8;
    case DataType::Int8: return ncclInt8;
    case DataType::UInt16:
    case DataType::Int16: return std::nullopt;
    case DataType::Int32: return ncclInt32;
    case DataType::Int64: return ncclInt64;
    case DataType::Float16: return ncclFloat16;
    case DataType::BFloat16: return ncclBfloat16;
    case DataType::Float32: return ncclFloat32;
    case DataType::Float64: return ncclFloat64;
    case DataType::Bool: return ncclUint8;  // 0 or 1: Min and Max are exact.
  }
  TUTTI_CHECK(false, "DataType ", static_cast<int>(dtype), " has no NCCL type");
}

ncclRedOp_t to_nccl_op(WireOp op) {
  switch (op) {
    case WireOp::Sum: return ncclSum;
    case WireOp::Min: return ncclMin;
    case WireOp::Max: return ncclMax;
    case WireOp::Product: return ncclProd;
  }
  TUTTI_CHECK(false, "WireOp ", static_cast<int>(op), " has no NCCL op");
}

// Arguments wrong on their own: the same answer on every member, so all return before NCCL.
Status check_reduction(DataType dtype, WireOp op) {
  if (dtype == DataType::Bool && (op == WireOp::Sum || op == WireOp::Product)) {
    return invalid_argument("NCCL reduces bool buffers with Min or Max only");
  }
  return Status();
}

std::size_t total(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

bool all_equal(std::span<const std::size_t> counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

const std::byte* at(const void* base, std::size_t bytes) {
  return static_cast<const std::byte*>(base) + bytes;
}
std::byte* at(void* base, std::size_t bytes) { return static_cast<std::byte*>(base) + bytes; }

// ncclGroupStart()/ncclGroupEnd() around a batch of calls; End runs even when a call failed,
// so NCCL's group state is never left open.
template <class Calls>
Status in_group(Calls&& calls) {
  TUTTI_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  const Status status = calls();
  const Status ended = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
  TUTTI_RETURN_IF_ERROR(status);
  return ended;
}

}  // namespace

Result<std::unique_ptr<NcclBackend>> NcclBackend::create(Backend& bootstrap, DeviceStream stream) {
  Result<cudaStream_t> native = cuda::cuda_device_ops().stream(stream);
  // Even when the stream failed, join the communicator's collectives (which then fail on
  // every member), so that no peer is left waiting.
  TUTTI_ASSIGN_OR_RETURN(NcclComm comm,
                         NcclComm::create(bootstrap, stream.device.index, native.status()));
  return std::unique_ptr<NcclBackend>(new NcclBackend(std::move(comm), stream, native.value()));
}

Result<std::byte*> NcclBackend::scratch(std::size_t bytes) {
  if (scratch_bytes_ < bytes || scratch_ == nullptr) {
    std::size_t capacity = std::max<std::size_t>(scratch_bytes_, 4096);
    while (capacity < bytes) capacity *= 2;
    void* memory = nullptr;
    TUTTI_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&memory, capacity, native_));
    const cudaStream_t native = native_;
    scratch_ = std::shared_ptr<void>(memory, [native](void* pointer) {
      static_cast<void>(cudaFreeAsync(pointer, native));  // A destructor cannot report.
    });
    scratch_bytes_ = capacity;
  }
  return static_cast<std::byte*>(scratch_.get());
}

Status NcclBackend::widen(const void* source, DataType dtype, std::int32_t* wide,
                          std::size_t count) {
  const cuda::CopyDescriptor copy{.source = source,
                                  .destination = wide,
                                  .count = count,
                                  .factor = 1.0,
                                  .first_unit = 0,
                                  .source_type = static_cast<cuda::KernelType>(dtype),
                                  .destination_type = cuda::KernelType::Int32,
                                  .flags = cuda::kCopyFlagModular};
  return cuda::cuda_device_ops().batched_copy(std::span<const cuda::CopyDescriptor>(&copy, 1),
                                              stream_);
}

Status NcclBackend::narrow(const std::int32_t* wide, void* destination, DataType dtype,
                           std::size_t count) {
  const cuda::CopyDescriptor copy{.source = wide,
                                  .destination = destination,
                                  .count = count,
                                  .factor = 1.0,
                                  .first_unit = 0,
                                  .source_type = cuda::KernelType::Int32,
                                  .destination_type = static_cast<cuda::KernelType>(dtype),
                                  .flags = cuda::kCopyFlagModular};
  return cuda::cuda_device_ops().batched_copy(std::span<const cuda::CopyDescriptor>(&copy, 1),
                                              stream_);
}

Status NcclBackend::allreduce(void* data, std::size_t count, DataType dtype, WireOp op) {
  TUTTI_RETURN_IF_ERROR(check_reduction(dtype, op));
  if (count == 0) return Status();
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  const std::optional<ncclDataType_t> type = to_nccl_type(dtype);
  if (type.has_value()) {
    TUTTI_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(data, data, count, *type, to_nccl_op(op), comm_.get(), native_));
    return Status();
  }
  TUTTI_ASSIGN_OR_RETURN(std::byte * memory, scratch(count * sizeof(std::int32_t)));
  auto* wide = reinterpret_cast<std::int32_t*>(memory);
  TUTTI_RETURN_IF_ERROR(widen(data, dtype, wide, count));
  TUTTI_NCCL_RETURN_IF_ERROR(
      ncclAllReduce(wide, wide, count, ncclInt32, to_nccl_op(op), comm_.get(), native_));
  return narrow(wide, data, dtype, count);
}

Status NcclBackend::allgatherv(const void* input, void* output, std::span<const std::size_t> counts,
                               DataType dtype) {
  TUTTI_CHECK(counts.size() == static_cast<std::size_t>(size()),
              "allgatherv needs one count per rank");
  const std::size_t element = element_size(dtype);
  if (total(counts) == 0) return Status();
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  if (all_equal(counts)) {
    TUTTI_NCCL_RETURN_IF_ERROR(
        ncclAllGather(input, output, counts[0] * element, ncclUint8, comm_.get(), native_));
    return Status();
  }
  // Uneven: every member broadcasts its rows into its place, all in one group.
  return in_group([&]() -> Status {
    std::size_t offset = 0;
    for (int root = 0; root < size(); ++root) {
      const std::size_t bytes = counts[static_cast<std::size_t>(root)] * element;
      if (bytes > 0) {
        TUTTI_NCCL_RETURN_IF_ERROR(
            ncclBroadcast(input, at(output, offset), bytes, ncclUint8, root, comm_.get(), native_));
      }
      offset += bytes;
    }
    return Status();
  });
}

Status NcclBackend::broadcast(void* data, std::size_t count, DataType dtype, int root) {
  const std::size_t bytes = count * element_size(dtype);
  if (bytes == 0) return Status();
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  TUTTI_NCCL_RETURN_IF_ERROR(
      ncclBroadcast(data, data, bytes, ncclUint8, root, comm_.get(), native_));
  return Status();
}

Status NcclBackend::alltoallv(const void* input, std::span<const std::size_t> send_counts,
                              void* output, std::span<const std::size_t> recv_counts,
                              DataType dtype) {
  const std::size_t element = element_size(dtype);
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  std::size_t send_offset = 0;
  std::size_t recv_offset = 0;
  std::size_t self_send = 0;
  std::size_t self_recv = 0;
  TUTTI_RETURN_IF_ERROR(in_group([&]() -> Status {
    for (int peer = 0; peer < size(); ++peer) {
      const std::size_t sent = send_counts[static_cast<std::size_t>(peer)] * element;
      const std::size_t received = recv_counts[static_cast<std::size_t>(peer)] * element;
      if (peer == rank()) {
        self_send = send_offset;
        self_recv = recv_offset;
      } else {
        // Zero counts are skipped on both sides alike: my send count to a peer is its
        // receive count from me.
        if (sent > 0) {
          TUTTI_NCCL_RETURN_IF_ERROR(
              ncclSend(at(input, send_offset), sent, ncclUint8, peer, comm_.get(), native_));
        }
        if (received > 0) {
          TUTTI_NCCL_RETURN_IF_ERROR(
              ncclRecv(at(output, recv_offset), received, ncclUint8, peer, comm_.get(), native_));
        }
      }
      send_offset += sent;
      recv_offset += received;
    }
    return Status();
  }));
  // This rank's own block is a local copy, ordered on the same stream.
  const std::size_t own = send_counts[static_cast<std::size_t>(rank())] * element;
  if (own > 0) {
    TUTTI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(at(output, self_recv), at(input, self_send), own,
                                               cudaMemcpyDeviceToDevice, native_));
  }
  return Status();
}

Status NcclBackend::reduce_scatter_native(const void* input, void* output,
                                          std::span<const std::size_t> recv_counts,
                                          ncclDataType_t type, std::size_t element,
                                          ncclRedOp_t op) {
  if (all_equal(recv_counts)) {
    TUTTI_NCCL_RETURN_IF_ERROR(
        ncclReduceScatter(input, output, recv_counts[0], type, op, comm_.get(), native_));
    return Status();
  }
  // Uneven: one reduce per block, rooted at the rank that keeps it, all in one group. A
  // non-root's receive buffer is ignored; it gets its send block, a valid device pointer.
  return in_group([&]() -> Status {
    std::size_t offset = 0;
    for (int root = 0; root < size(); ++root) {
      const std::size_t count = recv_counts[static_cast<std::size_t>(root)];
      const std::byte* block = at(input, offset * element);
      void* receive = root == rank() ? output : const_cast<std::byte*>(block);
      if (count > 0) {
        TUTTI_NCCL_RETURN_IF_ERROR(
            ncclReduce(block, receive, count, type, op, root, comm_.get(), native_));
      }
      offset += count;
    }
    return Status();
  });
}

Status NcclBackend::reducescatter(const void* input, void* output,
                                  std::span<const std::size_t> recv_counts, DataType dtype,
                                  WireOp op) {
  TUTTI_CHECK(recv_counts.size() == static_cast<std::size_t>(size()),
              "reducescatter needs one count per rank");
  TUTTI_RETURN_IF_ERROR(check_reduction(dtype, op));
  const std::size_t count = total(recv_counts);
  if (count == 0) return Status();
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  const std::optional<ncclDataType_t> type = to_nccl_type(dtype);
  if (type.has_value()) {
    return reduce_scatter_native(input, output, recv_counts, *type, element_size(dtype),
                                 to_nccl_op(op));
  }
  const std::size_t mine = recv_counts[static_cast<std::size_t>(rank())];
  TUTTI_ASSIGN_OR_RETURN(std::byte * memory, scratch((count + mine) * sizeof(std::int32_t)));
  auto* wide_input = reinterpret_cast<std::int32_t*>(memory);
  std::int32_t* wide_output = wide_input + count;
  TUTTI_RETURN_IF_ERROR(widen(input, dtype, wide_input, count));
  TUTTI_RETURN_IF_ERROR(reduce_scatter_native(wide_input, wide_output, recv_counts, ncclInt32,
                                              sizeof(std::int32_t), to_nccl_op(op)));
  return narrow(wide_output, output, dtype, mine);
}

Status NcclBackend::reduce(const void* input, void* output, std::size_t count, DataType dtype,
                           WireOp op, int root) {
  TUTTI_RETURN_IF_ERROR(check_reduction(dtype, op));
  if (count == 0) return Status();
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  const bool is_root = rank() == root;
  const std::optional<ncclDataType_t> type = to_nccl_type(dtype);
  if (type.has_value()) {
    // A non-root's receive buffer is ignored; it gets its input, a valid device pointer.
    void* receive = is_root ? output : const_cast<void*>(input);
    TUTTI_NCCL_RETURN_IF_ERROR(
        ncclReduce(input, receive, count, *type, to_nccl_op(op), root, comm_.get(), native_));
    return Status();
  }
  TUTTI_ASSIGN_OR_RETURN(std::byte * memory, scratch(count * sizeof(std::int32_t)));
  auto* wide = reinterpret_cast<std::int32_t*>(memory);
  TUTTI_RETURN_IF_ERROR(widen(input, dtype, wide, count));
  TUTTI_NCCL_RETURN_IF_ERROR(
      ncclReduce(wide, wide, count, ncclInt32, to_nccl_op(op), root, comm_.get(), native_));
  return is_root ? narrow(wide, output, dtype, count) : Status();
}

Status NcclBackend::gatherv(const void* input, void* output, std::span<const std::size_t> counts,
                            DataType dtype, int root) {
  // A gather only reads its own block.
  return rooted_blocks(Direction::Gather, output, const_cast<void*>(input), counts, dtype, root);
}

Status NcclBackend::scatterv(const void* input, std::span<const std::size_t> counts, void* output,
                             DataType dtype, int root) {
  // A scatter only reads the root's blocks.
  return rooted_blocks(Direction::Scatter, const_cast<void*>(input), output, counts, dtype, root);
}

Status NcclBackend::rooted_blocks(Direction direction, void* blocks, void* mine_at,
                                  std::span<const std::size_t> counts, DataType dtype, int root) {
  const bool gather = direction == Direction::Gather;
  TUTTI_CHECK(counts.size() == static_cast<std::size_t>(size()),
              gather ? "gatherv needs one count per rank" : "scatterv needs one count per rank");
  const std::size_t element = element_size(dtype);
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  const std::size_t mine = counts[static_cast<std::size_t>(rank())] * element;
  if (rank() != root) {
    // The root posts nothing for an empty block either.
    if (mine == 0) return Status();
    TUTTI_NCCL_RETURN_IF_ERROR(
        gather ? ncclSend(mine_at, mine, ncclUint8, root, comm_.get(), native_)
               : ncclRecv(mine_at, mine, ncclUint8, root, comm_.get(), native_));
    return Status();
  }
  std::size_t offset = 0;
  std::size_t own = 0;
  TUTTI_RETURN_IF_ERROR(in_group([&]() -> Status {
    for (int peer = 0; peer < size(); ++peer) {
      const std::size_t bytes = counts[static_cast<std::size_t>(peer)] * element;
      if (peer == rank()) {
        own = offset;
      } else if (bytes > 0) {
        void* block = at(blocks, offset);
        TUTTI_NCCL_RETURN_IF_ERROR(
            gather ? ncclRecv(block, bytes, ncclUint8, peer, comm_.get(), native_)
                   : ncclSend(block, bytes, ncclUint8, peer, comm_.get(), native_));
      }
      offset += bytes;
    }
    return Status();
  }));
  if (mine > 0) {
    void* own_block = at(blocks, own);
    TUTTI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(gather ? own_block : mine_at,
                                               gather ? mine_at : own_block, mine,
                                               cudaMemcpyDeviceToDevice, native_));
  }
  return Status();
}

Status NcclBackend::barrier() {
  cuda::ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(comm_.device()));
  TUTTI_ASSIGN_OR_RETURN(std::byte * memory, scratch(sizeof(std::int32_t)));
  TUTTI_NCCL_RETURN_IF_ERROR(
      ncclAllReduce(memory, memory, 1, ncclInt32, ncclSum, comm_.get(), native_));
  return Status();
}

Status NcclBackend::adasum(void* /*data*/, std::span<const std::size_t> /*tensor_counts*/,
                           DataType /*dtype*/) {
  return invalid_argument("ADASUM is not supported on CUDA tensors");
}

}  // namespace tutti::ops::nccl
