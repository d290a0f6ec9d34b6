// SPDX-License-Identifier: Apache-2.0
// See Note [Simulated device] in test/support/sim_device.h.
#include "test/support/sim_device.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <new>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "ops/convert.h"
#include "src/base/strings.h"
#include "src/common/check.h"
#include "src/common/logging.h"

namespace tutti::test {
namespace {

using detail::str_cat;

// CUDA's allocation granularity: cudaMalloc returns at least 256-byte aligned memory.
constexpr std::size_t kAlignmentBytes = 256;
constexpr unsigned char kGarbageByte = 0xA5;  // Uninitialized memory, so a missing copy shows.
constexpr unsigned char kFreedByte = 0xDD;    // Quarantined memory.
// Freed memory is returned to the host allocator once the quarantine holds more than this.
constexpr std::size_t kQuarantineBytes = std::size_t{64} << 20;
constexpr std::size_t kQuarantineAllocations = 1024;

std::string device_string(Device device) {
  return device.kind == Device::Kind::CUDA ? str_cat("cuda:", device.index) : "cpu";
}

std::string range_string(const void* address, std::size_t bytes) {
  return str_cat(address, " (", bytes, " bytes)");
}

bool valid_dtype(DataType dtype) {
  return static_cast<int>(dtype) <= static_cast<int>(DataType::Bool);
}

void free_memory(void* memory) { ::operator delete(memory, std::align_val_t(kAlignmentBytes)); }

}  // namespace

SimDeviceOps::SimDeviceOps(int device_count, std::chrono::microseconds max_delay)
    : device_count_(device_count), max_delay_(max_delay) {
  TUTTI_CHECK(device_count >= 0 && max_delay.count() >= 0, "SimDeviceOps(", device_count, ", ",
              max_delay.count(), "us): both must be non-negative");
}

SimDeviceOps::~SimDeviceOps() {
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    // The application's streams first: Tutti's may wait for them (wait_event), never the
    // other way round.
    for (const bool application : {true, false}) {
      for (auto& [key, worker] : streams_) {
        if ((key.second < 0) == application) worker->stop();
      }
    }
  }
  std::lock_guard<std::mutex> lock(memory_mutex_);
  const auto live = std::count_if(allocations_.begin(), allocations_.end(),
                                  [](const auto& entry) { return !entry.second.is_freed; });
  // Their deleters would call into this object later. See set_device_ops in ops/device_ops.h.
  TUTTI_CHECK(live == 0, "SimDeviceOps destroyed with ", live,
              " device or pinned allocations live; free them first");
  for (const auto& [address, allocation] : allocations_) free_memory(allocation.memory);
}

// ---- Memory.

std::shared_ptr<void> SimDeviceOps::allocate_registered(std::size_t bytes, int device,
                                                        unsigned char fill) {
  // At least one byte, so that distinct allocations have distinct addresses.
  void* memory = ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t(kAlignmentBytes));
  std::memset(memory, fill, bytes);
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    const bool is_new =
        allocations_
            .emplace(reinterpret_cast<std::uintptr_t>(memory), Allocation{memory, bytes, device})
            .second;
    TUTTI_CHECK(is_new, "the host allocator returned quarantined memory ", memory);
  }
  return std::shared_ptr<void>(memory, [this](void* freed) { release(freed); });
}

std::shared_ptr<void> SimDeviceOps::allocate_zeroed(std::size_t bytes, Device device) {
  if (device.kind != Device::Kind::CUDA || device.index < 0 || device.index >= device_count_) {
    throw Error(ErrorCode::InvalidArgument,
                str_cat("allocate_zeroed: ", device_string(device), " is not a simulated device (",
                        device_count_, " devices)"));
  }
  return allocate_registered(bytes, device.index, 0);
}

Result<std::shared_ptr<void>> SimDeviceOps::allocate(std::size_t bytes, Device device) {
  if (device.kind != Device::Kind::CUDA || device.index < 0 || device.index >= device_count_) {
    return invalid_argument(str_cat("allocate: ", device_string(device),
                                    " is not a simulated device (", device_count_, " devices)"));
  }
  return allocate_registered(bytes, device.index, kGarbageByte);
}

Result<std::shared_ptr<void>> SimDeviceOps::allocate_pinned(std::size_t bytes) {
  return allocate_registered(bytes, -1, kGarbageByte);
}

// The deleter: like cudaFree, waits for the streams that may still use the memory, then
// quarantines it (Note [Simulated device], item 1).
void SimDeviceOps::release(void* memory) {
  const auto address = reinterpret_cast<std::uintptr_t>(memory);
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    device = allocations_.at(address).device;
  }
  drain(device);
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    Allocation& allocation = allocations_.at(address);
    allocation.is_freed = true;
    std::memset(memory, kFreedByte, allocation.bytes);
    quarantine_.push_back(address);
    quarantine_bytes_ += allocation.bytes;
    while (quarantine_bytes_ > kQuarantineBytes || quarantine_.size() > kQuarantineAllocations) {
      auto oldest = allocations_.find(quarantine_.front());
      quarantine_.pop_front();
      quarantine_bytes_ -= oldest->second.bytes;
      evicted.push_back(oldest->second.memory);
      allocations_.erase(oldest);
    }
  }
  for (void* old : evicted) free_memory(old);
}

void SimDeviceOps::drain(int device) {
  std::vector<std::shared_ptr<Stream>> draining;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (const auto& [key, worker] : streams_) {
      if (device < 0 || key.first == device) draining.push_back(worker);
    }
  }
  for (const std::shared_ptr<Stream>& worker : draining) worker->wait(worker->enqueued());
}

std::size_t SimDeviceOps::allocations_live() const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return static_cast<std::size_t>(
      std::count_if(allocations_.begin(), allocations_.end(),
                    [](const auto& entry) { return !entry.second.is_freed; }));
}

std::size_t SimDeviceOps::bytes_allocated_live() const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  std::size_t bytes = 0;
  for (const auto& [address, allocation] : allocations_) {
    if (!allocation.is_freed) bytes += allocation.bytes;
  }
  return bytes;
}

// ---- Checks.

SimDeviceOps::Region SimDeviceOps::find(const void* address, std::size_t bytes) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - begin) {
    Region wrapping;  // Wraps around the address space: no allocation holds it.
    wrapping.kind = Region::Kind::Straddling;
    return wrapping;
  }
  const std::uintptr_t end = begin + bytes;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto after = allocations_.lower_bound(end);
  if (after == allocations_.begin()) return Region{};
  // The last allocation starting before `end`. Allocations are disjoint, so if it ends at or
  // before `begin`, so does every earlier one.
  const auto& [first, allocation] = *std::prev(after);
  if (first + allocation.bytes <= begin) return Region{};
  Region region{.found = allocation};
  if (begin < first || end > first + allocation.bytes) {
    region.kind = Region::Kind::Straddling;
  } else if (allocation.is_freed) {
    region.kind = Region::Kind::Freed;
  } else {
    region.kind = allocation.device < 0 ? Region::Kind::Pinned : Region::Kind::Device;
  }
  return region;
}

Status SimDeviceOps::violation(const std::string& message) {
  violations_.fetch_add(1);
  const std::string text = str_cat("simulated device: ", message);
  detail::log_message(detail::LogLevel::Error, text);
  return Status(ErrorCode::Internal, text);
}

Status SimDeviceOps::check_device(std::string_view call, Device device) {
  if (device.kind == Device::Kind::CUDA && device.index >= 0 && device.index < device_count_) {
    return Status();
  }
  return violation(str_cat(call, ": ", device_string(device), " is not a simulated device (",
                           device_count_, " devices)"));
}

Result<SimDeviceOps::Region::Kind> SimDeviceOps::check_range(std::string_view call,
                                                             std::string_view role,
                                                             const void* address, std::size_t bytes,
                                                             Expect expected, int device) {
  if (bytes == 0) return Region::Kind::Host;
  const Region region = find(address, bytes);
  using Kind = Region::Kind;
  const bool is_host = region.kind == Kind::Host || region.kind == Kind::Pinned;
  const bool is_ours = region.kind == Kind::Device && region.found.device == device;
  if ((expected != Expect::Host && is_ours) || (expected != Expect::Device && is_host)) {
    return region.kind;
  }
  std::string wanted = str_cat("device memory of cuda:", device);
  if (expected == Expect::Host) wanted = "host memory";
  if (expected == Expect::Either) wanted = str_cat("host memory or ", wanted);
  const std::string_view owner = region.found.device < 0 ? "pinned" : "device";
  const std::string where =
      region.found.device < 0 ? std::string() : str_cat(" of cuda:", region.found.device);
  std::string actual;
  switch (region.kind) {
    case Kind::Host: actual = "host memory"; break;
    case Kind::Pinned: actual = "pinned host memory"; break;
    case Kind::Device: actual = str_cat("device memory", where); break;
    case Kind::Freed: actual = str_cat("freed ", owner, " memory", where); break;
    case Kind::Straddling:
      actual = region.found.memory == nullptr
                   ? std::string("a range wrapping around the address space")
                   : str_cat("a range crossing the bounds of the ", region.found.bytes, "-byte ",
                             region.found.is_freed ? "freed " : "", owner, " allocation", where,
                             " at ", region.found.memory);
      break;
  }
  return violation(str_cat(call, ": ", role, " ", range_string(address, bytes), " must be ", wanted,
                           ", but is ", actual));
}

// A GPU runs the copies of one launch concurrently, so a destination may overlap nothing
// else of the launch, except its own source when scaling in place (same address and dtype).
Status SimDeviceOps::check_overlaps(std::span<const ops::CopySpec> copies) {
  struct Range {
    const void* address = nullptr;
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    std::size_t copy = 0;
    bool is_destination = false;
  };
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const ops::CopySpec& copy = copies[i];
    if (copy.count == 0) continue;
    const auto destination = reinterpret_cast<std::uintptr_t>(copy.destination);
    const auto source = reinterpret_cast<std::uintptr_t>(copy.source);
    ranges.push_back({copy.destination, destination,
                      destination + copy.count * element_size(copy.destination_type), i, true});
    ranges.push_back(
        {copy.source, source, source + copy.count * element_size(copy.source_type), i, false});
  }
  for (const Range& written : ranges) {
    if (!written.is_destination) continue;
    for (const Range& other : ranges) {
      if (&other == &written || other.end <= written.begin || written.end <= other.begin) continue;
      const ops::CopySpec& copy = copies[written.copy];
      if (other.copy == written.copy && copy.destination == copy.source &&
          copy.destination_type == copy.source_type) {
        continue;
      }
      return violation(str_cat("batched_copy: copy ", written.copy, " destination ",
                               range_string(written.address, written.end - written.begin),
                               " overlaps copy ", other.copy,
                               other.is_destination ? " destination " : " source ",
                               range_string(other.address, other.end - other.begin),
                               "; the copies of one launch run concurrently"));
    }
  }
  return Status();
}

// ---- Synchronous copies: at once, on the calling thread, unordered with stream work.

Status SimDeviceOps::copy_device_to_device(void* destination, const void* source, std::size_t bytes,
                                           Device device) {
  if (bytes == 0) return Status();
  constexpr std::string_view kCall = "copy_device_to_device";
  TUTTI_RETURN_IF_ERROR(check_device(kCall, device));
  TUTTI_RETURN_IF_ERROR(
      check_range(kCall, "destination", destination, bytes, Expect::Device, device.index).status());
  TUTTI_RETURN_IF_ERROR(
      check_range(kCall, "source", source, bytes, Expect::Device, device.index).status());
  std::memmove(destination, source, bytes);
  return Status();
}

Status SimDeviceOps::copy_to_host(void* host, const void* device_memory, std::size_t bytes,
                                  Device device) {
  if (bytes == 0) return Status();
  constexpr std::string_view kCall = "copy_to_host";
  TUTTI_RETURN_IF_ERROR(check_device(kCall, device));
  TUTTI_RETURN_IF_ERROR(check_range(kCall, "host", host, bytes, Expect::Host, 0).status());
  TUTTI_RETURN_IF_ERROR(
      check_range(kCall, "device_memory", device_memory, bytes, Expect::Device, device.index)
          .status());
  std::memcpy(host, device_memory, bytes);
  return Status();
}

Status SimDeviceOps::copy_to_device(void* device_memory, const void* host, std::size_t bytes,
                                    Device device) {
  if (bytes == 0) return Status();
  constexpr std::string_view kCall = "copy_to_device";
  TUTTI_RETURN_IF_ERROR(check_device(kCall, device));
  TUTTI_RETURN_IF_ERROR(
      check_range(kCall, "device_memory", device_memory, bytes, Expect::Device, device.index)
          .status());
  TUTTI_RETURN_IF_ERROR(check_range(kCall, "host", host, bytes, Expect::Host, 0).status());
  std::memcpy(device_memory, host, bytes);
  return Status();
}

// ---- Stream work: checked now, run by the stream's worker.

Result<std::shared_ptr<SimDeviceOps::Stream>> SimDeviceOps::stream(std::string_view call,
                                                                   ops::DeviceStream key) {
  if (key.index < 0) {
    return violation(str_cat(call, ": stream index ", key.index, " on ", device_string(key.device),
                             " is negative"));
  }
  TUTTI_RETURN_IF_ERROR(check_device(call, key.device));
  return find_or_create({key.device.index, key.index});
}

std::shared_ptr<SimDeviceOps::Stream> SimDeviceOps::find_or_create(std::pair<int, int> key) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  std::shared_ptr<Stream>& found = streams_[key];
  if (found == nullptr) {
    found = std::make_shared<Stream>(ops::DeviceStream{Device::cuda(key.first), key.second},
                                     max_delay_);
  }
  return found;
}

Status SimDeviceOps::batched_copy(std::span<const ops::CopySpec> copies, ops::DeviceStream key) {
  std::vector<ops::CopySpec> launched;  // The caller's span may die once this returns.
  std::copy_if(copies.begin(), copies.end(), std::back_inserter(launched),
               [](const ops::CopySpec& copy) { return copy.count > 0; });
  if (launched.empty()) return Status();
  constexpr std::string_view kCall = "batched_copy";
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, stream(kCall, key));
  for (std::size_t i = 0; i < copies.size(); ++i) {  // Numbered as the caller numbers them.
    const ops::CopySpec& copy = copies[i];
    if (copy.count == 0) continue;
    if (!valid_dtype(copy.destination_type) || !valid_dtype(copy.source_type)) {
      return invalid_argument(str_cat("batched_copy: copy ", i, " names an unknown DataType"));
    }
    TUTTI_RETURN_IF_ERROR(check_range(kCall, str_cat("copy ", i, " destination"), copy.destination,
                                      copy.count * element_size(copy.destination_type),
                                      Expect::Device, key.device.index)
                              .status());
    TUTTI_RETURN_IF_ERROR(check_range(kCall, str_cat("copy ", i, " source"), copy.source,
                                      copy.count * element_size(copy.source_type), Expect::Device,
                                      key.device.index)
                              .status());
  }
  TUTTI_RETURN_IF_ERROR(check_overlaps(copies));
  launches_.fetch_add(1);
  target->enqueue([launched = std::move(launched)] {
    for (const ops::CopySpec& copy : launched) {
      ops::cpu::convert_scale(copy.destination, copy.destination_type, copy.source,
                              copy.source_type, copy.count, copy.factor);
    }
  });
  return Status();
}

Status SimDeviceOps::fill_zero(void* data, std::size_t bytes, ops::DeviceStream key) {
  if (bytes == 0) return Status();
  constexpr std::string_view kCall = "fill_zero";
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, stream(kCall, key));
  TUTTI_RETURN_IF_ERROR(
      check_range(kCall, "data", data, bytes, Expect::Device, key.device.index).status());
  target->enqueue([data, bytes] { std::memset(data, 0, bytes); });
  return Status();
}

Status SimDeviceOps::copy_async(void* destination, const void* source, std::size_t bytes,
                                ops::DeviceStream key) {
  if (bytes == 0) return Status();
  constexpr std::string_view kCall = "copy_async";
  using Kind = Region::Kind;
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, stream(kCall, key));
  TUTTI_ASSIGN_OR_RETURN(const Kind to, check_range(kCall, "destination", destination, bytes,
                                                    Expect::Either, key.device.index));
  TUTTI_ASSIGN_OR_RETURN(const Kind from, check_range(kCall, "source", source, bytes,
                                                      Expect::Either, key.device.index));
  if (from == Kind::Host && to == Kind::Device) {
    // CUDA stages a pageable source before returning: the caller may reuse it at once.
    const auto* first = static_cast<const std::byte*>(source);
    target->enqueue([destination, staged = std::vector<std::byte>(first, first + bytes)] {
      std::memcpy(destination, staged.data(), staged.size());
    });
    return Status();
  }
  const std::uint64_t position =
      target->enqueue([destination, source, bytes] { std::memmove(destination, source, bytes); });
  // Only device-to-device and page-locked copies are asynchronous; CUDA finishes the others
  // (into pageable memory, or host to host) before returning.
  const bool is_asynchronous = (to == Kind::Device) || (to == Kind::Pinned && from == Kind::Device);
  if (!is_asynchronous) target->wait(position);
  return Status();
}

Result<std::unique_ptr<ops::DeviceEvent>> SimDeviceOps::record_event(ops::DeviceStream key) {
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, stream("record_event", key));
  const std::uint64_t position = target->enqueue([] {});
  return std::unique_ptr<ops::DeviceEvent>(std::make_unique<Stream::Event>(target, position));
}

Status SimDeviceOps::synchronize(ops::DeviceStream key) {
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, stream("synchronize", key));
  target->wait(target->enqueued());
  return Status();
}

// ---- The application's streams.

Result<std::shared_ptr<SimDeviceOps::Stream>> SimDeviceOps::app(std::string_view call, void* handle,
                                                                int device) {
  TUTTI_RETURN_IF_ERROR(check_device(call, Device::cuda(device)));
  if (handle == nullptr) return find_or_create({device, -1});
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (const auto& [key, worker] : streams_) {
      if (key.second <= -2 && worker.get() == handle) {
        if (key.first == device) return worker;
        return violation(str_cat(call, ": stream ", handle, " belongs to cuda:", key.first,
                                 ", not cuda:", device));
      }
    }
  }
  return violation(str_cat(call, ": ", handle, " is not a stream made by app_stream()"));
}

void* SimDeviceOps::app_stream(int device, int index) {
  TUTTI_CHECK(device >= 0 && device < device_count_ && index >= 0, "app_stream(", device, ", ",
              index, "): no such device, or a negative index");
  return find_or_create({device, -2 - index}).get();
}

Status SimDeviceOps::check_stream(void* handle) {
  if (handle == nullptr) return Status();
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (const auto& [key, worker] : streams_) {
      if (key.second <= -2 && worker.get() == handle) return Status();
    }
  }
  return violation(str_cat("check_stream: ", handle, " is not a stream made by app_stream()"));
}

Status SimDeviceOps::write_async(void* handle, int device, void* destination, const void* source,
                                 std::size_t bytes) {
  constexpr std::string_view kCall = "write_async";
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, app(kCall, handle, device));
  if (bytes == 0) return Status();
  TUTTI_RETURN_IF_ERROR(
      check_range(kCall, "destination", destination, bytes, Expect::Device, device).status());
  TUTTI_RETURN_IF_ERROR(check_range(kCall, "source", source, bytes, Expect::Host, 0).status());
  const auto* first = static_cast<const std::byte*>(source);
  target->enqueue([destination, staged = std::vector<std::byte>(first, first + bytes)] {
    std::memcpy(destination, staged.data(), staged.size());
  });
  return Status();
}

Result<std::unique_ptr<ops::DeviceEvent>> SimDeviceOps::record_ready(void* handle, Device device) {
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, app("record_ready", handle, device.index));
  const std::uint64_t position = target->enqueue([] {});
  return std::unique_ptr<ops::DeviceEvent>(std::make_unique<Stream::Event>(target, position));
}

Status SimDeviceOps::wait_event(ops::DeviceEvent& event, ops::DeviceStream key) {
  constexpr std::string_view kCall = "wait_event";
  auto* ours = dynamic_cast<Stream::Event*>(&event);
  if (ours == nullptr) return violation(str_cat(kCall, ": not an event of the simulated device"));
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<Stream> target, stream(kCall, key));
  // The worker blocks until the event's stream has run up to it, as the GPU holds the
  // stream's later work back; the host returns at once.
  target->enqueue(
      [awaited = ours->stream(), position = ours->position()] { awaited->wait(position); });
  return Status();
}

void SimDeviceOps::pause_app(void* handle, int device) {
  Result<std::shared_ptr<Stream>> target = app("pause_app", handle, device);
  TUTTI_CHECK(target.ok(), "pause_app: ", target.status().message());
  target.value()->set_paused(true);
}

void SimDeviceOps::resume_app(void* handle, int device) {
  Result<std::shared_ptr<Stream>> target = app("resume_app", handle, device);
  TUTTI_CHECK(target.ok(), "resume_app: ", target.status().message());
  target.value()->set_paused(false);
}

void SimDeviceOps::pause(ops::DeviceStream key) {
  Result<std::shared_ptr<Stream>> target = stream("pause", key);
  TUTTI_CHECK(target.ok(), "pause: ", target.status().message());
  target.value()->set_paused(true);
}

void SimDeviceOps::resume(ops::DeviceStream key) {
  Result<std::shared_ptr<Stream>> target = stream("resume", key);
  TUTTI_CHECK(target.ok(), "resume: ", target.status().message());
  target.value()->set_paused(false);
}

}  // namespace tutti::test
