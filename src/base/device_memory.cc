// SPDX-License-Identifier: Apache-2.0
#include "src/base/device_memory.h"

#include <atomic>
#include <cstring>
#include <string>

#include "src/base/host_memory_cache.h"

namespace tutti::base {
namespace {

std::atomic<DeviceMemory*> registered{nullptr};

DeviceMemory& device_memory(Device device) {
  if (DeviceMemory* memory = registered.load(std::memory_order_acquire)) return *memory;
  throw Error(ErrorCode::InvalidArgument,
              "cuda:" + std::to_string(device.index) +
                  " tensors need Tutti's ops library, which registers device memory when it "
                  "loads; none is registered in this program");
}

}  // namespace

void register_device_memory(DeviceMemory* memory) {
  registered.store(memory, std::memory_order_release);
}

std::shared_ptr<void> allocate_uninitialized(std::size_t bytes, Device device) {
  if (device.kind != Device::Kind::CPU) return device_memory(device).allocate_zeroed(bytes, device);
  return allocate_host(bytes);
}

std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) {
  std::shared_ptr<void> memory = allocate_uninitialized(bytes, device);
  if (device.kind == Device::Kind::CPU) std::memset(memory.get(), 0, bytes);
  return memory;
}

void copy_bytes(void* destination, const void* source, std::size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.kind != Device::Kind::CPU) {
    device_memory(device).copy(destination, source, bytes, device);
    return;
  }
  std::memcpy(destination, source, bytes);
}

}  // namespace tutti::base
