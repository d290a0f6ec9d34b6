// SPDX-License-Identifier: Apache-2.0
// Allocation and copies for Tensor storage on any device. The CPU path is here; device memory
// comes from whatever ops/ registered (Note [Device memory registry]).
//
// Note [Device memory registry]
// Tensor lives in src/base, below ops/, so it cannot ask ops::device_ops() for a CUDA tensor's
// storage. ops/ registers its device memory here instead, once, while the library loads (a
// static registrar in ops/registry.cc; c10's SetAllocator is the same idea). A build with CUDA
// registers CUDA memory, a build without it one that refuses with InvalidArgument, so nothing
// here needs to know which build it is in.
#pragma once

#include <cstddef>
#include <memory>

#include "tutti/tensor.h"

namespace tutti::base {

// Memory on a device other than the CPU. Implementations throw tutti::Error on failure.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Zero-filled memory of `bytes` on `device`, never null.
  virtual std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) = 0;
  // Copies `bytes` between two buffers on `device`.
  virtual void copy(void* destination, const void* source, std::size_t bytes, Device device) = 0;
};

// Installs the device memory that non-CPU tensors use (ops/ does, at load). `memory` is not
// owned and must outlive every tensor; a later call replaces an earlier one. Any thread.
void register_device_memory(DeviceMemory* memory);

// Zero-filled storage of `bytes` on `device` (never null, also for 0 bytes). Throws
// InvalidArgument for a device no registered memory serves, Communication if allocation fails.
std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device);

// Storage as allocate_zeroed()'s, but on the CPU its bytes are left as they come (Tensor::empty),
// from the host memory cache where it is large (Note [Host memory cache]). A device's memory is
// zero-filled all the same.
std::shared_ptr<void> allocate_uninitialized(std::size_t bytes, Device device);

// Copies `bytes` between two buffers on the same `device`.
void copy_bytes(void* destination, const void* source, std::size_t bytes, Device device);

}  // namespace tutti::base
