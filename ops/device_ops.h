// SPDX-License-Identifier: Apache-2.0
// The seam through which core touches device (CUDA) memory without CUDA headers. A build
// without CUDA gets an implementation whose every call fails with InvalidArgument.
#pragma once

#include <cstddef>
#include <memory>

#include "src/common/status.h"
#include "tutti/tensor.h"

namespace tutti::ops {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Zero-filled device memory; throws tutti::Error on failure (called from Tensor's
  // constructor, on the application thread).
  virtual std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) = 0;
  virtual Status copy_device_to_device(void* destination, const void* source, std::size_t bytes,
                                       Device device) = 0;
  virtual Status copy_to_host(void* host, const void* device_memory, std::size_t bytes,
                              Device device) = 0;
  virtual Status copy_to_device(void* device_memory, const void* host, std::size_t bytes,
                                Device device) = 0;
};

// The process-wide DeviceOps of this build (see ops/registry.cc). Any thread.
DeviceOps& device_ops();

}  // namespace tutti::ops
