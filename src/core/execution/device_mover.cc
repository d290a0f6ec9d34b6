// SPDX-License-Identifier: Apache-2.0
#include "src/core/execution/device_mover.h"

#include <algorithm>

#include "src/common/check.h"

namespace tutti::core {

Result<std::byte*> DeviceMover::scratch(std::size_t bytes) {
  TUTTI_CHECK(pending_.empty(), "scratch() with copies pending into the old buffer");
  if (bytes > capacity_ || buffer_ == nullptr) {
    // Grow by half again, so a slowly growing workload reallocates rarely.
    const std::size_t capacity = std::max(bytes, capacity_ + capacity_ / 2) / 4096 * 4096 + 4096;
    TUTTI_ASSIGN_OR_RETURN(buffer_, ops::device_ops().allocate(capacity, stream_.device));
    capacity_ = capacity;
  }
  return static_cast<std::byte*>(buffer_.get());
}

void DeviceMover::copy(const ops::CopySpec& copy) {
  if (copy.count > 0) pending_.push_back(copy);
}

Status DeviceMover::zero(void* data, std::size_t bytes) {
  return ops::device_ops().fill_zero(data, bytes, stream_);
}

Status DeviceMover::flush() {
  if (pending_.empty()) return Status();
  const Status status = ops::device_ops().batched_copy(pending_, stream_);
  pending_.clear();
  return status;
}

Result<Tensor> DeviceMover::new_tensor(DataType dtype, Shape shape) {
  try {
    return Tensor(dtype, std::move(shape), stream_.device);
  } catch (const Error& e) {  // Out of device memory, most likely.
    return Status(e.code(), e.what());
  }
}

}  // namespace tutti::core
