// SPDX-License-Identifier: Apache-2.0
#include "src/core/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/device_ops.h"

namespace tutti::core {

std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) {
  if (device.kind == Device::Kind::CUDA) return ops::device_ops().allocate_zeroed(bytes, device);
  // 64-byte alignment suits vector loads; at least one byte so data() is never null.
  const std::size_t rounded = (bytes + 63) / 64 * 64 + 64;
  void* memory = std::aligned_alloc(64, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  std::memset(memory, 0, bytes);
  return std::shared_ptr<void>(memory, [](void* p) { std::free(p); });
}

void copy_bytes(void* destination, const void* source, std::size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.kind == Device::Kind::CUDA) {
    ops::device_ops().copy_device_to_device(destination, source, bytes, device).throw_if_error();
    return;
  }
  std::memcpy(destination, source, bytes);
}

}  // namespace tutti::core
