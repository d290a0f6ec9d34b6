// SPDX-License-Identifier: Apache-2.0
// A CUDA device simulated over host memory: an ops::DeviceOps that tests install with
// ops::set_device_ops(), so the runtime's device path runs, and is checked, without a GPU.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "ops/device_ops.h"
#include "src/common/status.h"
#include "test/support/sim_stream.h"
#include "tutti/tensor.h"

namespace tutti::test {

// Note [Simulated device]
// No GPU in CI, yet core's device path (fusion through DeviceOps, backends taking device
// pointers, completion by events) must be tested. SimDeviceOps behaves like CUDA where a
// runtime can get CUDA wrong, and reports what a real GPU would only corrupt silently:
//   1. Memory. Device memory is 256-byte aligned host memory in a registry of live
//      allocations (address range, device); allocate() and allocate_pinned() fill it with
//      0xA5, so a missing copy shows. Freeing waits for the device's streams (as cudaFree
//      does; pinned memory waits for every stream, as cudaFreeHost does in practice), then
//      fills the memory with 0xDD and keeps it registered as freed for a while (a
//      quarantine), so a stale pointer is reported instead of meeting a new allocation.
//   2. Pointer checks. Every call checks its ranges synchronously: a range is device memory
//      of device d iff it lies inside one live allocation of d. Device sides must be device
//      memory of the call's device, host sides must not be device memory, and one
//      batched_copy's destinations overlap nothing else of the launch (a GPU runs its copies
//      concurrently). A violation is logged, counted in violations() (tests assert 0) and
//      returned as Status(Internal); nothing is enqueued then. Empty ranges always pass.
//   3. Streams. Each DeviceStream is a worker thread running its tasks in FIFO order, each
//      after a random delay in [0, max_delay], so a runtime that reads results before an
//      event or synchronize() sees stale data. As in CUDA, copy_async into pageable host
//      memory (or host to host) returns only when done, a pageable source is staged (read)
//      at the call, and the synchronous copies do not order with stream work.
//   4. The application's streams. app_stream() makes stand-ins for the application's
//      cudaStream_t, and nullptr stands for each device's legacy default stream; write_async()
//      enqueues a producer's write there (a kernel, a pageable cudaMemcpy), which lands late:
//      after the random delay, or once resume_app() releases a paused stream. Tutti's streams
//      do not wait for them (CUDA's non-blocking streams) unless ordered: record_ready() marks
//      a point of an application's stream, and wait_event() makes a stream's worker wait there
//      until that point has run. A runtime that skips the ordering reads stale inputs.
// What it cannot catch: the host dereferencing a device pointer (it is host memory), races
// between streams, or between stream work and synchronous copies, unless they corrupt data
// the test checks; CUDA error codes (nothing here fails like a device).
//
// Any thread may call any method; one stream's enqueueing calls (batched_copy, fill_zero,
// copy_async, record_event, wait_event) come from one thread at a time, as the DeviceOps
// contract says.
class SimDeviceOps final : public ops::DeviceOps {
 public:
  // Devices cuda:0 .. cuda:device_count-1; every stream task waits up to `max_delay` first.
  explicit SimDeviceOps(int device_count = 1,
                        std::chrono::microseconds max_delay = std::chrono::microseconds(200));
  // Finishes all queued work (paused streams included) and joins the stream threads. Every
  // allocation must have been freed (the deleters call into this object): aborts otherwise.
  ~SimDeviceOps() override;
  SimDeviceOps(const SimDeviceOps&) = delete;
  SimDeviceOps& operator=(const SimDeviceOps&) = delete;

  // ---- ops::DeviceOps: see ops/device_ops.h for the contract of each.
  // Throws Error(InvalidArgument) for a device outside [0, device_count).
  std::shared_ptr<void> allocate_zeroed(std::size_t bytes, Device device) override;
  Status copy_device_to_device(void* destination, const void* source, std::size_t bytes,
                               Device device) override;
  Status copy_to_host(void* host, const void* device_memory, std::size_t bytes,
                      Device device) override;
  Status copy_to_device(void* device_memory, const void* host, std::size_t bytes,
                        Device device) override;
  int device_count() override { return device_count_; }
  Result<std::shared_ptr<void>> allocate(std::size_t bytes, Device device) override;
  Result<std::shared_ptr<void>> allocate_pinned(std::size_t bytes) override;
  Status batched_copy(std::span<const ops::CopySpec> copies, ops::DeviceStream stream) override;
  Status fill_zero(void* data, std::size_t bytes, ops::DeviceStream stream) override;
  Status copy_async(void* destination, const void* source, std::size_t bytes,
                    ops::DeviceStream stream) override;
  Result<std::unique_ptr<ops::DeviceEvent>> record_event(ops::DeviceStream stream) override;
  Status synchronize(ops::DeviceStream stream) override;
  // A violation unless `stream` is nullptr or made by app_stream().
  Status check_stream(void* stream) override;
  // A violation unless `stream` is nullptr or an app_stream() of `device`.
  Result<std::unique_ptr<ops::DeviceEvent>> record_ready(void* stream, Device device) override;
  // A violation unless `event` is one of this device's.
  Status wait_event(ops::DeviceEvent& event, ops::DeviceStream stream) override;

  // ---- The application's streams (Note [Simulated device], item 4). Any thread.
  // A stream of the application on cuda:`device` (a stand-in for a cudaStream_t), for
  // tutti::cuda::set_current_stream and write_async; `index` tells several apart. Created on
  // first use; lives as long as this object. The device must be valid.
  void* app_stream(int device, int index = 0);
  // Enqueues on the application's `stream` of cuda:`device` (nullptr: that device's legacy
  // default stream) a write of `bytes` from host memory `source` (read now) into `destination`,
  // device memory of that device. It lands when the stream runs it, after the call returns.
  // Checked as copy_to_device.
  Status write_async(void* stream, int device, void* destination, const void* source,
                     std::size_t bytes);
  // As pause() and resume(), for an application's stream (nullptr: the legacy default).
  void pause_app(void* stream, int device);
  void resume_app(void* stream, int device);

  // ---- For tests. Any thread.
  // Checks failed so far (Note [Simulated device], item 2), including DeviceStreams naming a
  // device outside [0, device_count) or a negative index.
  std::uint64_t violations() const { return violations_.load(); }
  // batched_copy calls that enqueued work: kernel launches on a GPU.
  std::uint64_t launches() const { return launches_.load(); }
  // Device and pinned allocations not freed yet, and their requested bytes.
  std::size_t allocations_live() const;
  std::size_t bytes_allocated_live() const;
  // Holds `stream` before its next task until resume(`stream`), so pending work stays
  // pending deterministically. Meanwhile synchronize(), events' wait(), a blocking
  // copy_async and freeing memory of the stream's device block. The stream must be valid.
  void pause(ops::DeviceStream stream);
  void resume(ops::DeviceStream stream);

 private:
  using Stream = SimStream;

  struct Allocation {
    void* memory = nullptr;
    std::size_t bytes = 0;  // As requested: the checks' bound.
    int device = -1;        // -1 for pinned host memory.
    bool is_freed = false;  // Quarantined.
  };
  // What the byte range [address, address + bytes) is, by the registry.
  struct Region {
    enum class Kind { Host, Pinned, Device, Freed, Straddling } kind = Kind::Host;
    Allocation found;  // The allocation it lies in or overlaps; memory is null for Host.
  };

  std::shared_ptr<void> allocate_registered(std::size_t bytes, int device, unsigned char fill);
  void release(void* memory);
  void drain(int device);  // -1: every stream.
  Region find(const void* address, std::size_t bytes) const;
  Status check_device(std::string_view call, Device device);
  enum class Expect { Device, Host, Either };
  // The kind of a range that is what `expected` allows (device memory of cuda:`device`, host
  // memory or either), else a violation. An empty range is Host.
  Result<Region::Kind> check_range(std::string_view call, std::string_view role,
                                   const void* address, std::size_t bytes, Expect expected,
                                   int device);
  Status check_overlaps(std::span<const ops::CopySpec> copies);
  Status violation(const std::string& message);
  // The stream's worker, created on first use; a violation for a stream of no device.
  Result<std::shared_ptr<Stream>> stream(std::string_view call, ops::DeviceStream key);
  // The worker of an application's stream of `device` (nullptr: the legacy default stream),
  // else a violation. Their keys in streams_ have negative indices: -1 for the legacy default
  // stream, -2 - index for app_stream(device, index); a handle is the worker's address.
  Result<std::shared_ptr<Stream>> app(std::string_view call, void* handle, int device);
  std::shared_ptr<Stream> find_or_create(std::pair<int, int> key);

  const int device_count_;
  const std::chrono::microseconds max_delay_;
  std::atomic<std::uint64_t> violations_{0};
  std::atomic<std::uint64_t> launches_{0};

  mutable std::mutex memory_mutex_;
  // Live and quarantined allocations by first address; disjoint. Guarded by memory_mutex_.
  std::map<std::uintptr_t, Allocation> allocations_;
  std::deque<std::uintptr_t> quarantine_;  // Oldest first. Guarded by memory_mutex_.
  std::size_t quarantine_bytes_ = 0;       // Guarded by memory_mutex_.

  std::mutex streams_mutex_;
  // By (device, index), created on first use; the application's streams first (negative
  // indices), so the destructor drains them before Tutti's streams, which may wait for them.
  // Guarded by streams_mutex_.
  std::map<std::pair<int, int>, std::shared_ptr<Stream>> streams_;
};

}  // namespace tutti::test
