// SPDX-License-Identifier: Apache-2.0
// Helpers of the gpu suite: device buffers, raw copies, and the skip rule of the MPI gpu
// binaries. Values to and from bytes come from test/support/device_test_util.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "ops/device_ops.h"
#include "test/support/device_test_util.h"
#include "tutti/tensor.h"

namespace tutti::test {

// Exit code that Meson counts as a skipped test.
inline constexpr int kSkipExitCode = 77;

// Throws (failing the test case) when a CUDA call in a test fails.
inline void cuda_check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(code));
  }
}

// Device memory of the current device, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) {
    cuda_check(cudaMalloc(&memory_, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  ~DeviceBuffer() { static_cast<void>(cudaFree(memory_)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::byte* get() const { return static_cast<std::byte*>(memory_); }

 private:
  void* memory_ = nullptr;
};

// Makes Tutti's `stream` wait, on the device, for the work enqueued so far on the legacy
// default stream: what core does for every op (Note [Stream ordering] in ops/cuda/stream.h).
inline void order_after_legacy_stream(ops::DeviceStream stream) {
  ops::DeviceOps& device = ops::device_ops();
  Result<std::unique_ptr<ops::DeviceEvent>> ready = device.record_ready(nullptr, stream.device);
  if (!ready.ok()) throw std::runtime_error(std::string(ready.status().message()));
  const Status waited = device.wait_event(*ready.value(), stream);
  if (!waited.ok()) throw std::runtime_error(std::string(waited.message()));
}

// Copies `host` to `device` memory with cudaMemcpy, which from pageable memory may return
// before the data lands, and orders Tutti's `reader` stream after it.
inline void upload(void* device, const std::vector<std::byte>& host, ops::DeviceStream reader) {
  if (!host.empty()) {
    cuda_check(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  order_after_legacy_stream(reader);
}

inline std::vector<std::byte> download(const void* device, std::size_t bytes) {
  std::vector<std::byte> host(bytes);
  if (bytes > 0) {
    cuda_check(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), "download");
  }
  return host;
}

// Polls `event` as core's communication thread does, failing after `limit`.
inline Status poll_until_done(ops::DeviceEvent& event,
                              std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<bool> done = event.poll();
    if (!done.ok()) return done.status();
    if (done.value()) return Status();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status(ErrorCode::Stalled, "device event still pending");
}

inline const std::vector<DataType> kEveryDtype = {
    DataType::UInt8,   DataType::Int8,    DataType::UInt16,  DataType::Int16,
    DataType::Int32,   DataType::Int64,   DataType::Float16, DataType::BFloat16,
    DataType::Float32, DataType::Float64, DataType::Bool};

// Defined by each MPI binary of the gpu suite: how many CUDA devices a host must show for the
// binary to run when `local_size` of its ranks share the host. If any host shows fewer, every
// rank exits with kSkipExitCode (gpu_mpi_main.cc).
int devices_needed(int local_size);

}  // namespace tutti::test
