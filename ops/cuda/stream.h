// SPDX-License-Identifier: Apache-2.0
// RAII CUDA streams and events, and the current-device guard every CUDA call runs under.
//
// Note [Stream ordering]
// Tutti works on its own non-blocking streams, TUTTI_NUM_NCCL_STREAMS of them per device
// (ops::DeviceStream::index), created on first use and kept for the process; it never uses
// the legacy default stream, which would serialize with the application's kernels. Ordering
// with the application (tutti/cuda.h states the rule for users):
//   1. At the call, on the submitting thread, Session::submit records an event, from a pool,
//      on that thread's current stream (tutti::cuda::current_stream(); nullptr is the legacy
//      default stream, which also covers cudaMemcpy and blocking streams): DeviceOps::
//      record_ready. A stream that cannot be recorded on fails the call with InvalidArgument.
//      The calling thread never waits for the device.
//   2. The communication thread, before a device batch's first work on its lane's stream,
//      enqueues cudaStreamWaitEvent for each op's event (DevicePath::wait_for_producers) and
//      gives the event back to the pool. Everything after it on that stream, for every
//      collective, fused or in place, NCCL or the host-staged MPI copies, rooted ops built on
//      them, reads the inputs (and writes the outputs) only after the producer's work.
//   3. On one stream everything is ordered: the wait, the fusion pack kernel, the collective,
//      the unpack kernel; so no event is needed between them, and a device fusion buffer used
//      on one stream only may be reused by the next batch on that stream without waiting.
//      Work on two streams is unordered: core keeps a fusion buffer per stream.
//   4. An op is done when an event recorded after its unpack has completed: a thread of core's
//      polls it (cudaEventQuery, never blocking) and completes the handles then, so
//      Handle::wait() returns once the outputs can be read, and the inputs written, from any
//      stream of the device.
// Cost per op: one cudaEventRecord on the submitting thread (events are pooled per device:
// cudaEventCreate would cost more than the record) and one cudaStreamWaitEvent on the
// communication thread; not yet measured on a GPU against P2 (issue 23).
// Point-to-point ops take CPU tensors only. The simulated device (test/support/sim_device.h)
// models producer streams whose writes land late, and test/mpi/device/stream_ordering_test.cc
// fails if step 1 or 2 is skipped.
#pragma once

#include <cuda_runtime.h>

#include "src/common/status.h"
#include "tutti/tensor.h"

namespace tutti::ops::cuda {

// The number of devices this process sees; 0 when there is no device or no usable driver.
int visible_device_count();

// InvalidArgument unless `device` is a CUDA device this process sees, naming it.
Status check_device(Device device);

// Makes a device current for the scope and restores the previous one on destruction, so that
// calls on application threads leave the application's current device alone. Any thread.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice();

  // Makes `device` current (once per guard).
  Status enter(int device);

 private:
  int previous_ = -1;
  int current_ = -1;
};

// A non-blocking stream on one device. Move-only; destroyed with its owner.
class CudaStream {
 public:
  CudaStream() = default;
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  static Result<CudaStream> create(int device);

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

// A point in a stream's work, without timing. Move-only. query() and synchronize() may be
// called from any thread; record() from the thread that owns the stream.
class CudaEvent {
 public:
  CudaEvent() = default;
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  // An event of `device`. synchronize() yields the thread instead of spinning.
  static Result<CudaEvent> create(int device);

  // Captures the work enqueued on `stream` (of the event's device) so far.
  Status record(cudaStream_t stream);
  // True once the captured work is done (or nothing was recorded), false while it is pending;
  // Status(Communication) if the device reported an error. Never blocks.
  Result<bool> query() const;
  // Blocks until the captured work is done.
  Status synchronize() const;

  bool valid() const { return event_ != nullptr; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace tutti::ops::cuda
