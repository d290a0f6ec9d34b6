// SPDX-License-Identifier: Apache-2.0
// ops::DeviceOps for CUDA: Tensor storage (cudaMalloc), synchronous copies, and the stream
// work of device fusion. Also the CUDA-typed pieces ops/nccl and the host-staged backend
// share with it: the streams themselves and kernel-level batched copies.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "ops/cuda/kernels.h"
#include "ops/cuda/stream.h"
#include "ops/device_ops.h"
#include "src/common/mutex.h"

namespace tutti::ops::cuda {

// Any thread, except that the stream work of one DeviceStream (batched_copy, fill_zero,
// copy_async, record_event, wait_event) comes from one thread at a time (core's communication
// thread); record_ready comes from any application thread.
// Synchronous copies run on a per-device stream of their own, so an application thread never
// waits for collectives in flight. Streams live as long as the process.
class CudaDeviceOps final : public DeviceOps {
 public:
  CudaDeviceOps() = default;
  CudaDeviceOps(const CudaDeviceOps&) = delete;
  CudaDeviceOps& operator=(const CudaDeviceOps&) = delete;

  std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) override;
  Status copy_device_to_device(void* destination, const void* source, std::size_t bytes,
                               Device device) override;
  Status copy_to_host(void* host, const void* device_memory, std::size_t bytes,
                      Device device) override;
  Status copy_to_device(void* device_memory, const void* host, std::size_t bytes,
                        Device device) override;

  int device_count() override;
  Result<std::shared_ptr<void>> allocate(std::size_t bytes, Device device) override;
  Result<std::shared_ptr<void>> allocate_pinned(std::size_t bytes) override;
  Status batched_copy(std::span<const CopySpec> copies, DeviceStream stream) override;
  Status fill_zero(void* data, std::size_t bytes, DeviceStream stream) override;
  Status copy_async(void* destination, const void* source, std::size_t bytes,
                    DeviceStream stream) override;
  Result<std::unique_ptr<DeviceEvent>> record_event(DeviceStream stream) override;
  Status synchronize(DeviceStream stream) override;
  Status check_stream(void* /*stream*/) override { return Status(); }
  Result<std::unique_ptr<DeviceEvent>> record_ready(void* stream, Device device) override;
  Status wait_event(DeviceEvent& event, DeviceStream stream) override;

  // The CUDA stream behind `stream`, created on first use. Any thread.
  Result<cudaStream_t> stream(DeviceStream stream);
  // batched_copy with kernel descriptors (first_unit is filled in here), for callers that
  // need kCopyFlagModular. Copies with count 0 are dropped.
  Status batched_copy(std::span<const CopyDescriptor> copies, DeviceStream stream);

 private:
  // Descriptors of one launch: staged in page-locked memory, copied to the device on the
  // stream, read by the kernel. A slot is reused once the event recorded after its launch
  // has completed, so the host never waits for an earlier launch to write the next one.
  struct DescriptorSlot {
    std::shared_ptr<void> host;    // CopyDescriptor[capacity], page-locked.
    std::shared_ptr<void> device;  // CopyDescriptor[capacity].
    std::size_t capacity = 0;
    CudaEvent done;  // Recorded after the launch that last read the slot.
  };
  struct StreamState {
    CudaStream stream;
    // Blocks of a batched copy launch: as many as the device keeps resident (Note [Batched
    // copy launch] in kernels.h).
    std::uint64_t resident_blocks = 1;
    std::vector<std::unique_ptr<DescriptorSlot>> slots;  // The stream's thread only.
  };
  class PooledEvent;  // A DeviceEvent over an event of idle_events_; in device_ops.cc.
  // The stream index used for synchronous copies on application threads.
  static constexpr int kSynchronousStream = -1;

  Result<StreamState*> state(DeviceStream stream);
  // An idle event of `device` from the pool (created when the pool is empty), recorded on
  // `native`; it goes back to the pool when the returned DeviceEvent is destroyed. Any thread.
  Result<std::unique_ptr<DeviceEvent>> record_pooled(cudaStream_t native, int device)
      TUTTI_EXCLUDES(pool_mutex_);
  void give_back(int device, cudaEvent_t event) TUTTI_EXCLUDES(pool_mutex_);
  Result<DescriptorSlot*> free_slot(StreamState& state, std::size_t count);
  Status copy_synchronously(void* destination, const void* source, std::size_t bytes,
                            Device device);

  detail::Mutex mutex_;
  std::map<std::pair<int, int>, std::unique_ptr<StreamState>> streams_ TUTTI_GUARDED_BY(mutex_);
  // Idle events by device: an op records one at its call and one when its batch is done, and
  // cudaEventCreate costs more than the record itself. Never destroyed (see cuda_device_ops()).
  detail::Mutex pool_mutex_;
  std::map<int, std::vector<cudaEvent_t>> idle_events_ TUTTI_GUARDED_BY(pool_mutex_);
};

// The process's CudaDeviceOps: created on first use and never destroyed, so that streams and
// memory freed late (a Tensor destroyed at exit) never meet a destroyed object.
CudaDeviceOps& cuda_device_ops();

}  // namespace tutti::ops::cuda
