// SPDX-License-Identifier: Apache-2.0
#include "ops/cuda/device_ops.h"

#include <algorithm>
#include <cstring>

#include "ops/cuda/cuda_error.h"
#include "src/base/strings.h"

namespace tutti::ops::cuda {
namespace {

// The kernels see DataType through KernelType; both follow API.md's order.
template <DataType kData, KernelType kKernel>
constexpr bool kSameCode = static_cast<int>(kData) == static_cast<int>(kKernel);
static_assert(kSameCode<DataType::UInt8, KernelType::UInt8> &&
              kSameCode<DataType::Int8, KernelType::Int8> &&
              kSameCode<DataType::UInt16, KernelType::UInt16> &&
              kSameCode<DataType::Int16, KernelType::Int16> &&
              kSameCode<DataType::Int32, KernelType::Int32> &&
              kSameCode<DataType::Int64, KernelType::Int64> &&
              kSameCode<DataType::Float16, KernelType::Float16> &&
              kSameCode<DataType::BFloat16, KernelType::BFloat16> &&
              kSameCode<DataType::Float32, KernelType::Float32> &&
              kSameCode<DataType::Float64, KernelType::Float64> &&
              kSameCode<DataType::Bool, KernelType::Bool>);

constexpr std::size_t kMinimumSlotDescriptors = 256;

KernelType kernel_type(DataType dtype) { return static_cast<KernelType>(dtype); }

bool valid_dtype(DataType dtype) {
  return static_cast<int>(dtype) <= static_cast<int>(DataType::Bool);
}

// Device memory freed with cudaFree on its own device. cudaFree waits for the device's
// pending work, so a buffer in flight is never freed under a kernel.
std::shared_ptr<void> own_device_memory(void* memory, int device) {
  return std::shared_ptr<void>(memory, [device](void* pointer) {
    ScopedDevice scoped;
    // A destructor cannot report; at process exit the runtime may be gone already.
    if (scoped.enter(device).ok()) static_cast<void>(cudaFree(pointer));
  });
}

}  // namespace

class CudaDeviceOps::PooledEvent final : public DeviceEvent {
 public:
  PooledEvent(CudaDeviceOps& owner, int device, cudaEvent_t event)
      : owner_(owner), device_(device), event_(event) {}
  ~PooledEvent() override { owner_.give_back(device_, event_); }
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;

  Result<bool> poll() override {
    const cudaError_t code = cudaEventQuery(event_);
    if (code == cudaErrorNotReady) return false;
    TUTTI_RETURN_IF_ERROR(cuda_status(code, "cudaEventQuery"));
    return true;
  }
  Status wait() override {
    TUTTI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return Status();
  }
  cudaEvent_t native() const { return event_; }

 private:
  CudaDeviceOps& owner_;
  int device_;
  cudaEvent_t event_;
};

std::shared_ptr<void> CudaDeviceOps::allocate_zeroed(std::size_t bytes, Device device) {
  check_device(device).throw_if_error();
  ScopedDevice scoped;
  scoped.enter(device.index).throw_if_error();
  void* memory = nullptr;
  // At least one allocation unit, so that data() is never null (also for 0 bytes).
  cuda_status(cudaMalloc(&memory, std::max<std::size_t>(bytes, 256)), "cudaMalloc")
      .throw_if_error();
  std::shared_ptr<void> owned = own_device_memory(memory, device.index);
  Result<StreamState*> synchronous = state(DeviceStream{device, kSynchronousStream});
  synchronous.status().throw_if_error();
  const cudaStream_t stream = synchronous.value()->stream.get();
  cuda_status(cudaMemsetAsync(memory, 0, bytes, stream), "cudaMemsetAsync").throw_if_error();
  cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize").throw_if_error();
  return owned;
}

Status CudaDeviceOps::copy_synchronously(void* destination, const void* source, std::size_t bytes,
                                         Device device) {
  if (bytes == 0) return Status();
  TUTTI_RETURN_IF_ERROR(check_device(device));
  TUTTI_ASSIGN_OR_RETURN(StreamState * synchronous,
                         state(DeviceStream{device, kSynchronousStream}));
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(device.index));
  const cudaStream_t stream = synchronous->stream.get();
  TUTTI_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
  TUTTI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status();
}

Status CudaDeviceOps::copy_device_to_device(void* destination, const void* source,
                                            std::size_t bytes, Device device) {
  return copy_synchronously(destination, source, bytes, device);
}

Status CudaDeviceOps::copy_to_host(void* host, const void* device_memory, std::size_t bytes,
                                   Device device) {
  return copy_synchronously(host, device_memory, bytes, device);
}

Status CudaDeviceOps::copy_to_device(void* device_memory, const void* host, std::size_t bytes,
                                     Device device) {
  return copy_synchronously(device_memory, host, bytes, device);
}

int CudaDeviceOps::device_count() { return visible_device_count(); }

Result<std::shared_ptr<void>> CudaDeviceOps::allocate(std::size_t bytes, Device device) {
  TUTTI_RETURN_IF_ERROR(check_device(device));
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(device.index));
  void* memory = nullptr;
  TUTTI_CUDA_RETURN_IF_ERROR(cudaMalloc(&memory, std::max<std::size_t>(bytes, 256)));
  return own_device_memory(memory, device.index);
}

Result<std::shared_ptr<void>> CudaDeviceOps::allocate_pinned(std::size_t bytes) {
  void* memory = nullptr;
  // Portable: usable with the streams of every device.
  TUTTI_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&memory, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable));
  return std::shared_ptr<void>(memory, [](void* pointer) {
    static_cast<void>(cudaFreeHost(pointer));  // A destructor cannot report.
  });
}

Status CudaDeviceOps::batched_copy(std::span<const CopySpec> copies, DeviceStream stream) {
  std::vector<CopyDescriptor> descriptors;
  descriptors.reserve(copies.size());
  for (const CopySpec& copy : copies) {
    if (!valid_dtype(copy.source_type) || !valid_dtype(copy.destination_type)) {
      return invalid_argument("batched_copy: a copy names an unknown DataType");
    }
    descriptors.push_back(CopyDescriptor{.source = copy.source,
                                         .destination = copy.destination,
                                         .count = copy.count,
                                         .factor = copy.factor,
                                         .first_unit = 0,
                                         .source_type = kernel_type(copy.source_type),
                                         .destination_type = kernel_type(copy.destination_type),
                                         .flags = 0});
  }
  return batched_copy(std::span<const CopyDescriptor>(descriptors), stream);
}

Status CudaDeviceOps::batched_copy(std::span<const CopyDescriptor> copies, DeviceStream stream) {
  std::size_t count = 0;
  for (const CopyDescriptor& copy : copies) count += copy.count > 0 ? 1 : 0;
  if (count == 0) return Status();
  TUTTI_ASSIGN_OR_RETURN(StreamState * target, state(stream));
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(stream.device.index));
  TUTTI_ASSIGN_OR_RETURN(DescriptorSlot * slot, free_slot(*target, count));
  auto* staged = static_cast<CopyDescriptor*>(slot->host.get());
  std::size_t at = 0;
  for (const CopyDescriptor& copy : copies) {
    if (copy.count > 0) staged[at++] = copy;
  }
  BatchedCopyArgs args{.descriptors = static_cast<const CopyDescriptor*>(slot->device.get()),
                       .descriptor_count = count,
                       .unit_count = plan_batched_copy(staged, count),
                       .block_count = target->resident_blocks};
  const cudaStream_t native = target->stream.get();
  TUTTI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      slot->device.get(), staged, count * sizeof(CopyDescriptor), cudaMemcpyHostToDevice, native));
  TUTTI_RETURN_IF_ERROR(
      cuda_status(static_cast<cudaError_t>(launch_batched_copy_scale(&args, native)),
                  "launch_batched_copy_scale"));
  return slot->done.record(native);
}

Result<CudaDeviceOps::DescriptorSlot*> CudaDeviceOps::free_slot(StreamState& target,
                                                                std::size_t count) {
  DescriptorSlot* slot = nullptr;
  for (const std::unique_ptr<DescriptorSlot>& candidate : target.slots) {
    TUTTI_ASSIGN_OR_RETURN(bool idle, candidate->done.query());
    if (idle && (slot == nullptr || candidate->capacity >= count)) slot = candidate.get();
    if (slot != nullptr && slot->capacity >= count) break;
  }
  const int device = target.stream.device();
  if (slot == nullptr) {
    // Every slot is still read by a launch in flight: add one rather than wait.
    auto added = std::make_unique<DescriptorSlot>();
    TUTTI_ASSIGN_OR_RETURN(added->done, CudaEvent::create(device));
    target.slots.push_back(std::move(added));
    slot = target.slots.back().get();
  }
  if (slot->capacity < count) {
    std::size_t capacity = kMinimumSlotDescriptors;
    while (capacity < count) capacity *= 2;
    const std::size_t bytes = capacity * sizeof(CopyDescriptor);
    TUTTI_ASSIGN_OR_RETURN(slot->host, allocate_pinned(bytes));
    // Stream-ordered, so growing never waits for other streams (cudaFree would).
    const cudaStream_t native = target.stream.get();
    void* memory = nullptr;
    TUTTI_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&memory, bytes, native));
    slot->device = std::shared_ptr<void>(memory, [native](void* pointer) {
      static_cast<void>(cudaFreeAsync(pointer, native));  // A destructor cannot report.
    });
    slot->capacity = capacity;
  }
  return slot;
}

Status CudaDeviceOps::fill_zero(void* data, std::size_t bytes, DeviceStream stream) {
  if (bytes == 0) return Status();
  TUTTI_ASSIGN_OR_RETURN(cudaStream_t native, this->stream(stream));
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(stream.device.index));
  TUTTI_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, bytes, native));
  return Status();
}

Status CudaDeviceOps::copy_async(void* destination, const void* source, std::size_t bytes,
                                 DeviceStream stream) {
  if (bytes == 0) return Status();
  TUTTI_ASSIGN_OR_RETURN(cudaStream_t native, this->stream(stream));
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(stream.device.index));
  TUTTI_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, native));
  return Status();
}

Result<std::unique_ptr<DeviceEvent>> CudaDeviceOps::record_event(DeviceStream stream) {
  TUTTI_ASSIGN_OR_RETURN(cudaStream_t native, this->stream(stream));
  return record_pooled(native, stream.device.index);
}

Result<std::unique_ptr<DeviceEvent>> CudaDeviceOps::record_ready(void* stream, Device device) {
  if (device.kind != Device::Kind::CUDA || device.index < 0) {
    return invalid_argument("record_ready: not a CUDA device");
  }
  // nullptr means the legacy default stream, also in code built with per-thread default
  // streams (tutti/cuda.h); cudaStreamLegacy names it explicitly.
  const cudaStream_t native =
      stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
  Result<std::unique_ptr<DeviceEvent>> recorded = record_pooled(native, device.index);
  if (recorded.ok()) return recorded;
  return invalid_argument(detail::str_cat("could not record an event on the current CUDA stream ",
                                          stream, " (tutti/cuda.h) for cuda:", device.index,
                                          " tensors; is it a live stream of that device? ",
                                          recorded.status().message()));
}

Status CudaDeviceOps::wait_event(DeviceEvent& event, DeviceStream stream) {
  auto* pooled = dynamic_cast<PooledEvent*>(&event);
  if (pooled == nullptr) return invalid_argument("wait_event: not an event of the CUDA DeviceOps");
  TUTTI_ASSIGN_OR_RETURN(cudaStream_t native, this->stream(stream));
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(stream.device.index));
  // Enqueued on the device: the host goes on at once. An event of another device is allowed
  // (CUDA orders across devices).
  TUTTI_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(native, pooled->native(), 0));
  return Status();
}

Result<std::unique_ptr<DeviceEvent>> CudaDeviceOps::record_pooled(cudaStream_t native, int device) {
  cudaEvent_t event = nullptr;
  {
    detail::MutexLock lock(pool_mutex_);
    std::vector<cudaEvent_t>& idle = idle_events_[device];
    if (!idle.empty()) {
      event = idle.back();
      idle.pop_back();
    }
  }
  ScopedDevice scoped;
  TUTTI_RETURN_IF_ERROR(scoped.enter(device));
  if (event == nullptr) {
    // Blocking sync: DeviceEvent::wait() yields the thread instead of spinning.
    TUTTI_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  }
  // Owned from here: a failed record gives the event back to the pool.
  auto pooled = std::make_unique<PooledEvent>(*this, device, event);
  TUTTI_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, native));
  return std::unique_ptr<DeviceEvent>(std::move(pooled));
}

void CudaDeviceOps::give_back(int device, cudaEvent_t event) {
  // Safe to record again at once: work that waits for it (cudaStreamWaitEvent) or queries it
  // holds on to the record it saw, and a PooledEvent is destroyed only after its last use.
  detail::MutexLock lock(pool_mutex_);
  idle_events_[device].push_back(event);
}

Status CudaDeviceOps::synchronize(DeviceStream stream) {
  TUTTI_ASSIGN_OR_RETURN(cudaStream_t native, this->stream(stream));
  TUTTI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(native));
  return Status();
}

Result<cudaStream_t> CudaDeviceOps::stream(DeviceStream stream) {
  TUTTI_ASSIGN_OR_RETURN(StreamState * found, state(stream));
  return found->stream.get();
}

Result<CudaDeviceOps::StreamState*> CudaDeviceOps::state(DeviceStream stream) {
  const std::pair<int, int> key(stream.device.index, stream.index);
  detail::MutexLock lock(mutex_);
  auto found = streams_.find(key);
  if (found != streams_.end()) return found->second.get();
  TUTTI_RETURN_IF_ERROR(check_device(stream.device));
  if (stream.index < kSynchronousStream) {
    return invalid_argument(detail::str_cat("stream index ", stream.index, " is negative"));
  }
  auto created = std::make_unique<StreamState>();
  TUTTI_ASSIGN_OR_RETURN(created->stream, CudaStream::create(stream.device.index));
  {
    ScopedDevice scoped;  // The occupancy query reads the current device.
    TUTTI_RETURN_IF_ERROR(scoped.enter(stream.device.index));
    TUTTI_RETURN_IF_ERROR(cuda_status(static_cast<cudaError_t>(batched_copy_resident_blocks(
                                          stream.device.index, &created->resident_blocks)),
                                      "batched_copy_resident_blocks"));
  }
  StreamState* raw = created.get();
  streams_.emplace(key, std::move(created));
  return raw;
}

CudaDeviceOps& cuda_device_ops() {
  static CudaDeviceOps* const ops = new CudaDeviceOps();  // Never destroyed; see the header.
  return *ops;
}

}  // namespace tutti::ops::cuda
