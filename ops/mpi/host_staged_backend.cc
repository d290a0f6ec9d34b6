// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/host_staged_backend.h"

#include <algorithm>
#include <numeric>

namespace tutti::ops::mpi {
namespace {

std::size_t total(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

}  // namespace

Status HostStagedBackend::reserve(Staging& staging, std::size_t bytes) {
  if (staging.capacity >= bytes && staging.memory != nullptr) return Status();
  TUTTI_RETURN_IF_ERROR(device_ops().synchronize(stream_));
  std::size_t capacity = std::max<std::size_t>(staging.capacity, 4096);
  while (capacity < bytes) capacity *= 2;
  TUTTI_ASSIGN_OR_RETURN(staging.memory, device_ops().allocate_pinned(capacity));
  staging.capacity = capacity;
  return Status();
}

Status HostStagedBackend::download(Staging& staging, const void* device_data, std::size_t bytes) {
  if (bytes > 0)
    TUTTI_RETURN_IF_ERROR(device_ops().copy_async(staging.get(), device_data, bytes, stream_));
  return device_ops().synchronize(stream_);
}

Status HostStagedBackend::upload(void* device_data, const Staging& staging, std::size_t bytes) {
  if (bytes == 0) return Status();
  return device_ops().copy_async(device_data, staging.get(), bytes, stream_);
}

// A failed device copy does not skip the host collective: the peers are already in it, and
// leaving them there would hang the job. The copy's error is reported after it.
Status HostStagedBackend::allreduce(void* data, std::size_t count, DataType dtype, WireOp op) {
  const std::size_t bytes = count * element_size(dtype);
  TUTTI_RETURN_IF_ERROR(reserve(send_, bytes));
  const Status staged = download(send_, data, bytes);
  TUTTI_RETURN_IF_ERROR(host_.allreduce(send_.get(), count, dtype, op));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(data, send_, bytes);
}

Status HostStagedBackend::allgatherv(const void* input, void* output,
                                     std::span<const std::size_t> counts, DataType dtype) {
  const std::size_t element = element_size(dtype);
  const std::size_t mine = counts[static_cast<std::size_t>(rank())] * element;
  const std::size_t all = total(counts) * element;
  TUTTI_RETURN_IF_ERROR(reserve(receive_, all));
  TUTTI_RETURN_IF_ERROR(reserve(send_, mine));
  const Status staged = download(send_, input, mine);
  TUTTI_RETURN_IF_ERROR(host_.allgatherv(send_.get(), receive_.get(), counts, dtype));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(output, receive_, all);
}

Status HostStagedBackend::broadcast(void* data, std::size_t count, DataType dtype, int root) {
  const std::size_t bytes = count * element_size(dtype);
  TUTTI_RETURN_IF_ERROR(reserve(send_, bytes));
  // Every rank waits for its stream: the staging memory may still feed the last copy back.
  const Status staged = download(send_, data, rank() == root ? bytes : 0);
  TUTTI_RETURN_IF_ERROR(host_.broadcast(send_.get(), count, dtype, root));
  TUTTI_RETURN_IF_ERROR(staged);
  return rank() == root ? Status() : upload(data, send_, bytes);
}

Status HostStagedBackend::alltoallv(const void* input, std::span<const std::size_t> send_counts,
                                    void* output, std::span<const std::size_t> recv_counts,
                                    DataType dtype) {
  const std::size_t element = element_size(dtype);
  const std::size_t received = total(recv_counts) * element;
  const std::size_t sent = total(send_counts) * element;
  TUTTI_RETURN_IF_ERROR(reserve(receive_, received));
  TUTTI_RETURN_IF_ERROR(reserve(send_, sent));
  const Status staged = download(send_, input, sent);
  TUTTI_RETURN_IF_ERROR(
      host_.alltoallv(send_.get(), send_counts, receive_.get(), recv_counts, dtype));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(output, receive_, received);
}

Status HostStagedBackend::reducescatter(const void* input, void* output,
                                        std::span<const std::size_t> recv_counts, DataType dtype,
                                        WireOp op) {
  const std::size_t element = element_size(dtype);
  const std::size_t mine = recv_counts[static_cast<std::size_t>(rank())] * element;
  const std::size_t sent = total(recv_counts) * element;
  TUTTI_RETURN_IF_ERROR(reserve(receive_, mine));
  TUTTI_RETURN_IF_ERROR(reserve(send_, sent));
  const Status staged = download(send_, input, sent);
  TUTTI_RETURN_IF_ERROR(host_.reducescatter(send_.get(), receive_.get(), recv_counts, dtype, op));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(output, receive_, mine);
}

// The rooted ops stage only what this rank sends and copy back only what it receives.
Status HostStagedBackend::reduce(const void* input, void* output, std::size_t count, DataType dtype,
                                 WireOp op, int root) {
  const std::size_t bytes = count * element_size(dtype);
  TUTTI_RETURN_IF_ERROR(reserve(send_, bytes));
  const Status staged = download(send_, input, bytes);
  TUTTI_RETURN_IF_ERROR(host_.reduce(send_.get(), send_.get(), count, dtype, op, root));
  TUTTI_RETURN_IF_ERROR(staged);
  return rank() == root ? upload(output, send_, bytes) : Status();
}

Status HostStagedBackend::gatherv(const void* input, void* output,
                                  std::span<const std::size_t> counts, DataType dtype, int root) {
  const std::size_t element = element_size(dtype);
  const std::size_t mine = counts[static_cast<std::size_t>(rank())] * element;
  const std::size_t all = rank() == root ? total(counts) * element : 0;
  TUTTI_RETURN_IF_ERROR(reserve(receive_, all));
  TUTTI_RETURN_IF_ERROR(reserve(send_, mine));
  const Status staged = download(send_, input, mine);
  TUTTI_RETURN_IF_ERROR(host_.gatherv(send_.get(), receive_.get(), counts, dtype, root));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(output, receive_, all);
}

Status HostStagedBackend::scatterv(const void* input, std::span<const std::size_t> counts,
                                   void* output, DataType dtype, int root) {
  const std::size_t element = element_size(dtype);
  const std::size_t mine = counts[static_cast<std::size_t>(rank())] * element;
  const std::size_t sent = rank() == root ? total(counts) * element : 0;
  TUTTI_RETURN_IF_ERROR(reserve(receive_, mine));
  TUTTI_RETURN_IF_ERROR(reserve(send_, sent));
  // Every rank waits for its stream: the staging memory may still feed the last copy back.
  const Status staged = download(send_, input, sent);
  TUTTI_RETURN_IF_ERROR(host_.scatterv(send_.get(), counts, receive_.get(), dtype, root));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(output, receive_, mine);
}

Status HostStagedBackend::barrier() { return host_.barrier(); }

Status HostStagedBackend::adasum(void* data, std::span<const std::size_t> tensor_counts,
                                 DataType dtype) {
  const std::size_t bytes = total(tensor_counts) * element_size(dtype);
  TUTTI_RETURN_IF_ERROR(reserve(send_, bytes));
  const Status staged = download(send_, data, bytes);
  TUTTI_RETURN_IF_ERROR(host_.adasum(send_.get(), tensor_counts, dtype));
  TUTTI_RETURN_IF_ERROR(staged);
  return upload(data, send_, bytes);
}

}  // namespace tutti::ops::mpi
