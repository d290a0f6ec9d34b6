// SPDX-License-Identifier: Apache-2.0
// Allocation and copies for Tensor storage on any device. The CPU path is here; CUDA memory
// goes through ops/ (only there may CUDA headers appear), and a build without CUDA refuses it.
#pragma once

#include <cstddef>
#include <memory>

#include "tutti/tensor.h"

namespace tutti::core {

// Zero-filled storage of `bytes` on `device` (never null, also for 0 bytes). Throws
// InvalidArgument for a CUDA device in a build without CUDA, Communication if allocation fails.
std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device);

// Copies `bytes` between two buffers on the same `device`.
void copy_bytes(void* destination, const void* source, std::size_t bytes, Device device);

}  // namespace tutti::core
