// SPDX-License-Identifier: Apache-2.0
#include "ops/cuda/stream.h"

#include <utility>

#include "ops/cuda/cuda_error.h"
#include "src/base/strings.h"

namespace tutti::ops::cuda {

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // No driver or no device: nothing to clear later.
    return 0;
  }
  return count;
}

Status check_device(Device device) {
  if (device.kind != Device::Kind::CUDA) {
    return invalid_argument("a CUDA operation was given a CPU buffer");
  }
  const int count = visible_device_count();
  if (device.index < 0 || device.index >= count) {
    return invalid_argument(detail::str_cat("cuda:", device.index,
                                            " does not exist: this process sees ", count,
                                            " CUDA device", count == 1 ? "" : "s"));
  }
  return Status();
}

ScopedDevice::~ScopedDevice() {
  // Restoring cannot fail for a device that was current a moment ago; nothing to report.
  if (previous_ >= 0 && previous_ != current_) static_cast<void>(cudaSetDevice(previous_));
}

Status ScopedDevice::enter(int device) {
  int previous = 0;
  TUTTI_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  if (previous != device) TUTTI_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  previous_ = previous;
  current_ = device;
  return Status();
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(std::exchange(other.device_, -1)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    this->~CudaStream();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

CudaStream::~CudaStream() {
  // At process exit the runtime may already be unloaded; destruction then fails harmlessly.
  if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
}

Result<CudaStream> CudaStream::create(int device) {
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(device));
  CudaStream stream;
  TUTTI_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking));
  stream.device_ = device;
  return stream;
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    this->~CudaEvent();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) static_cast<void>(cudaEventDestroy(event_));  // See ~CudaStream.
}

Result<CudaEvent> CudaEvent::create(int device) {
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(device));
  CudaEvent event;
  TUTTI_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event.event_, cudaEventDisableTiming | cudaEventBlockingSync));
  return event;
}

Status CudaEvent::record(cudaStream_t stream) {
  TUTTI_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return Status();
}

Result<bool> CudaEvent::query() const {
  const cudaError_t code = cudaEventQuery(event_);
  if (code == cudaErrorNotReady) return false;
  TUTTI_RETURN_IF_ERROR(cuda_status(code, "cudaEventQuery"));
  return true;
}

Status CudaEvent::synchronize() const {
  TUTTI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return Status();
}

}  // namespace tutti::ops::cuda
