// SPDX-License-Identifier: Apache-2.0
// The seam through which core touches device (CUDA) memory without CUDA headers: allocation
// and copies for Tensor storage, and the asynchronous stream work of device fusion (batched
// pack/unpack kernel, staging copies, completion events). A build without CUDA gets an
// implementation whose every call fails with InvalidArgument.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "src/common/status.h"
#include "tutti/tensor.h"

namespace tutti::ops {

// One of Tutti's own device work queues (a non-blocking CUDA stream): `index` counts from 0
// up to TUTTI_NUM_NCCL_STREAMS - 1 on `device`. Created on first use and kept for the
// process. See Note [Stream ordering] in ops/cuda/stream.h.
struct DeviceStream {
  Device device = Device::cuda(0);
  int index = 0;
  friend bool operator==(const DeviceStream&, const DeviceStream&) = default;
};

// One tensor of a batched copy (DeviceOps::batched_copy), the device twin of
// ops::cpu::convert_scale:
//   destination[i] = destination_type(source[i] * factor),  0 <= i < count
// in float when both types are Float16, BFloat16 or Float32, in double otherwise; conversion
// to an integer type truncates toward zero and saturates; equal types with factor 1 copy the
// bytes. Both pointers are device memory of the stream's device. Source and destination do
// not overlap, or are the same address with the same dtype (scaling in place). Any alignment
// works; 16-byte aligned pointers take the vector path (core: place tensors in a fusion
// buffer at 16-byte aligned offsets).
struct CopySpec {
  void* destination = nullptr;
  DataType destination_type = DataType::Float32;
  const void* source = nullptr;
  DataType source_type = DataType::Float32;
  std::size_t count = 0;
  double factor = 1.0;
};

// A point in a DeviceStream's work, from DeviceOps::record_event.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // True once all work enqueued on the stream before the event is done, false while it is
  // pending, Status(Communication) if the device reported an error (a failed kernel or copy).
  // Never blocks. Any thread.
  virtual Result<bool> poll() = 0;
  // Blocks the calling thread (yielding, not spinning) until poll() would return true, or
  // returns the error it would. Any thread; not for the communication loop's fast path.
  virtual Status wait() = 0;
};

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

  // ---- Asynchronous device work for core's fusion path (Note [Stream ordering]).
  // The calls below enqueue on `stream` and return; they are made by the communication thread
  // (at most one thread per stream at a time). A build without CUDA answers InvalidArgument.

  // Devices this process sees: 0 without CUDA, a driver or a device. Any thread.
  virtual int device_count() { return 0; }
  // Uninitialized device memory (a fusion buffer), at least 256-byte aligned, freed when the
  // last owner lets go (cudaFree, which waits for the device's pending work). Any thread.
  virtual Result<std::shared_ptr<void>> allocate(std::size_t /*bytes*/, Device device) {
    return no_device(device);
  }
  // Page-locked host memory for staging copies, so copy_async runs asynchronously. Any thread.
  virtual Result<std::shared_ptr<void>> allocate_pinned(std::size_t /*bytes*/) {
    return no_device(Device::cuda(0));
  }
  // Every copy of `copies` in one kernel launch (ops/cuda/kernels.cu): pack with prescale and
  // widening, unpack with postscale or 1/size and narrowing. Copies with count 0 are skipped;
  // an empty span enqueues nothing.
  virtual Status batched_copy(std::span<const CopySpec> /*copies*/, DeviceStream stream) {
    return no_device(stream.device);
  }
  // Zeroes `bytes` of device memory (a joined rank's contribution).
  virtual Status fill_zero(void* /*data*/, std::size_t /*bytes*/, DeviceStream stream) {
    return no_device(stream.device);
  }
  // Copies `bytes` in any direction (host <-> device, device <-> device), ordered on `stream`.
  // Asynchronous for page-locked host memory (allocate_pinned); with pageable host memory
  // CUDA stages it, and a device-to-host copy returns when done.
  virtual Status copy_async(void* /*destination*/, const void* /*source*/, std::size_t /*bytes*/,
                            DeviceStream stream) {
    return no_device(stream.device);
  }
  // An event after everything enqueued on `stream` so far: poll it to learn when an op's
  // outputs are ready (then complete its handle).
  virtual Result<std::unique_ptr<DeviceEvent>> record_event(DeviceStream stream) {
    return no_device(stream.device);
  }
  // Blocks until everything enqueued on `stream` so far is done.
  virtual Status synchronize(DeviceStream stream) { return no_device(stream.device); }

  // ---- Ordering after the application's streams (Note [Stream ordering] in ops/cuda/stream.h).
  // A stream of the application is a cudaStream_t as void*; nullptr is the legacy default
  // stream of the device concerned.

  // OK if `stream` may be made a thread's current stream (tutti/cuda.h): nullptr always, other
  // values where device streams exist. Without CUDA, InvalidArgument naming the build. Any
  // thread; does not look at the stream itself.
  virtual Status check_stream(void* stream) {
    if (stream == nullptr) return Status();
    return Status(ErrorCode::InvalidArgument,
                  "a CUDA stream was given, but this Tutti was built without CUDA (meson setup "
                  "-Dcuda=enabled)");
  }
  // An event after the work enqueued so far on the application's `stream` of `device`: what an
  // op submitted now must wait for. Called on the submitting thread; never blocks (an event
  // record, from a pool). InvalidArgument if the stream cannot be recorded on (not a stream of
  // `device`).
  virtual Result<std::unique_ptr<DeviceEvent>> record_ready(void* /*stream*/, Device device) {
    return no_device(device);
  }
  // Makes `stream` wait, on the device, for `event` (from record_ready or record_event) before
  // the work enqueued on it after this call; returns at once. Stream work (one thread per
  // stream, as above). `event` may be destroyed, or recorded again, once this returns.
  virtual Status wait_event(DeviceEvent& /*event*/, DeviceStream stream) {
    return no_device(stream.device);
  }

 protected:
  static Status no_device(Device device) {
    return Status(ErrorCode::InvalidArgument,
                  "cuda:" + std::to_string(device.index) +
                      " tensors need a Tutti built with CUDA (meson -Dcuda=enabled)");
  }
};

// The process-wide DeviceOps: this build's (see ops/registry.cc), or the one installed with
// set_device_ops. Any thread.
DeviceOps& device_ops();

// Replaces the process-wide DeviceOps with `ops` (not owned; it must outlive every use), or
// restores this build's own with nullptr. For tests that simulate a device on the CPU
// (test/support/sim_device.h). Call it while Tutti is not initialized and no device memory
// exists.
void set_device_ops(DeviceOps* ops);

}  // namespace tutti::ops
