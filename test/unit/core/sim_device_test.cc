// SPDX-License-Identifier: Apache-2.0
// The simulated device against closed forms: conversions, stream order, events, the pointer
// checks, and the CUDA behaviours it imitates (cudaFree waits, pageable copies block).
#include "test/support/sim_device.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "src/base/strings.h"
#include "tutti/half.h"

namespace tutti {
namespace {

using ops::CopySpec;
using ops::DeviceStream;
using test::SimDeviceOps;
using namespace std::chrono_literals;

const DeviceStream kStream{Device::cuda(0), 0};

// Device memory of `device` holding `values`.
template <class T>
std::shared_ptr<void> upload(SimDeviceOps& sim, const std::vector<T>& values,
                             Device device = Device::cuda(0)) {
  Result<std::shared_ptr<void>> memory = sim.allocate(values.size() * sizeof(T), device);
  REQUIRE(memory.ok());
  REQUIRE(sim.copy_to_device(memory.value().get(), values.data(), values.size() * sizeof(T), device)
              .ok());
  return memory.value();
}

template <class T>
std::vector<T> download(SimDeviceOps& sim, const void* memory, std::size_t count,
                        Device device = Device::cuda(0)) {
  std::vector<T> values(count);
  REQUIRE(sim.copy_to_host(values.data(), memory, count * sizeof(T), device).ok());
  return values;
}

std::shared_ptr<void> allocate(SimDeviceOps& sim, std::size_t bytes,
                               Device device = Device::cuda(0)) {
  Result<std::shared_ptr<void>> memory = sim.allocate(bytes, device);
  REQUIRE(memory.ok());
  return memory.value();
}

// Runs `call` on another thread, so that a call wrongly blocked by a paused stream fails the
// test (returned() is false after 5 s) instead of hanging it; resume the stream before get().
std::future<Status> start(std::function<Status()> call) {
  return std::async(std::launch::async, std::move(call));
}
bool returned(std::future<Status>& call) { return call.wait_for(5s) == std::future_status::ready; }

TEST_CASE("SimDeviceOps allocates aligned device memory, zeroed or filled with garbage",
          "[sim_device]") {
  SimDeviceOps sim(2);
  CHECK(sim.device_count() == 2);
  std::shared_ptr<void> zeroed = sim.allocate_zeroed(100, Device::cuda(1));
  std::shared_ptr<void> garbage = allocate(sim, 100);
  Result<std::shared_ptr<void>> pinned = sim.allocate_pinned(64);
  REQUIRE(pinned.ok());
  CHECK(reinterpret_cast<std::uintptr_t>(zeroed.get()) % 256 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(garbage.get()) % 256 == 0);
  CHECK(download<std::uint8_t>(sim, zeroed.get(), 100, Device::cuda(1)) ==
        std::vector<std::uint8_t>(100, 0));
  CHECK(download<std::uint8_t>(sim, garbage.get(), 100) == std::vector<std::uint8_t>(100, 0xA5));
  CHECK(static_cast<const std::uint8_t*>(pinned.value().get())[63] == 0xA5);
  CHECK(sim.allocations_live() == 3);
  CHECK(sim.bytes_allocated_live() == 264);

  for (Device wrong : {Device::cuda(2), Device::cuda(-1), Device::cpu()}) {
    try {
      static_cast<void>(sim.allocate_zeroed(8, wrong));
      FAIL("allocate_zeroed accepted a device outside the simulated ones");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
    }
    CHECK(sim.allocate(8, wrong).status().code() == ErrorCode::InvalidArgument);
  }
  zeroed.reset();
  garbage.reset();
  pinned = Status(ErrorCode::Internal, "released");
  CHECK(sim.allocations_live() == 0);
  CHECK(sim.bytes_allocated_live() == 0);
  CHECK(sim.violations() == 0);
}

TEST_CASE("batched_copy converts and scales as convert_scale does", "[sim_device]") {
  SimDeviceOps sim;
  std::shared_ptr<void> floats = upload(sim, std::vector<float>{1.0f, -3.0f, 6.5f, 0.25f});
  std::shared_ptr<void> ints = upload(sim, std::vector<std::int32_t>{3, -7, 1 << 20});
  std::shared_ptr<void> scaled = upload(sim, std::vector<float>{1.0f, -3.0f});
  std::shared_ptr<void> halves = allocate(sim, 4 * sizeof(float16));
  std::shared_ptr<void> doubles = allocate(sim, 3 * sizeof(double));
  const std::vector<CopySpec> copies = {
      {.destination = halves.get(),
       .destination_type = DataType::Float16,
       .source = floats.get(),
       .source_type = DataType::Float32,
       .count = 4,
       .factor = 0.5},
      {.count = 0},  // Skipped: its null pointers are never checked.
      {.destination = doubles.get(),
       .destination_type = DataType::Float64,
       .source = ints.get(),
       .source_type = DataType::Int32,
       .count = 3,
       .factor = 2.5},
      // In place (same address and dtype) is allowed.
      {.destination = scaled.get(), .source = scaled.get(), .count = 2, .factor = 2.0}};
  REQUIRE(sim.batched_copy(copies, kStream).ok());
  CHECK(sim.launches() == 1);
  CHECK(sim.batched_copy({}, kStream).ok());  // Nothing to launch.
  CHECK(sim.batched_copy(std::vector<CopySpec>{{.count = 0}}, kStream).ok());
  CHECK(sim.launches() == 1);
  REQUIRE(sim.synchronize(kStream).ok());

  std::vector<std::uint16_t> half_bits;
  for (float16 h : download<float16>(sim, halves.get(), 4)) half_bits.push_back(h.bits);
  CHECK(half_bits == std::vector<std::uint16_t>{float16(0.5f).bits, float16(-1.5f).bits,
                                                float16(3.25f).bits, float16(0.125f).bits});
  CHECK(download<double>(sim, doubles.get(), 3) == std::vector<double>{7.5, -17.5, 2621440.0});
  CHECK(download<float>(sim, scaled.get(), 2) == std::vector<float>{2.0f, -6.0f});
  CHECK(sim.violations() == 0);
}

TEST_CASE("A stream runs its work in the order it was enqueued", "[sim_device]") {
  SimDeviceOps sim(1, 2ms);
  std::vector<std::int32_t> original(64);
  for (std::size_t i = 0; i < original.size(); ++i) original[i] = static_cast<std::int32_t>(i * 7);
  const std::size_t bytes = original.size() * sizeof(std::int32_t);
  for (int round = 0; round < 3; ++round) {
    std::shared_ptr<void> a = upload(sim, original);
    std::shared_ptr<void> b = allocate(sim, bytes);
    std::shared_ptr<void> c = allocate(sim, bytes);
    std::shared_ptr<void> d = allocate(sim, bytes);
    const std::vector<CopySpec> a_to_b = {{.destination = b.get(),
                                           .destination_type = DataType::Int32,
                                           .source = a.get(),
                                           .source_type = DataType::Int32,
                                           .count = original.size()}};
    REQUIRE(sim.batched_copy(a_to_b, kStream).ok());
    REQUIRE(sim.copy_async(c.get(), b.get(), bytes, kStream).ok());  // B to C.
    REQUIRE(sim.fill_zero(b.get(), bytes, kStream).ok());
    REQUIRE(sim.copy_async(d.get(), b.get(), bytes, kStream).ok());  // Zeros to D.
    REQUIRE(sim.synchronize(kStream).ok());
    CHECK(download<std::int32_t>(sim, c.get(), original.size()) == original);
    CHECK(download<std::int32_t>(sim, d.get(), original.size()) ==
          std::vector<std::int32_t>(original.size(), 0));
  }
  CHECK(sim.violations() == 0);
}

TEST_CASE("An event is pending until its stream has run the work before it", "[sim_device]") {
  SimDeviceOps sim(1, 100us);
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  std::shared_ptr<void> source = upload(sim, values);
  std::shared_ptr<void> destination = allocate(sim, sizeof(float) * values.size());
  const std::vector<CopySpec> copy = {
      {.destination = destination.get(), .source = source.get(), .count = values.size()}};

  sim.pause(kStream);
  REQUIRE(sim.batched_copy(copy, kStream).ok());
  Result<std::unique_ptr<ops::DeviceEvent>> event = sim.record_event(kStream);
  REQUIRE(event.ok());
  Result<bool> done = event.value()->poll();
  REQUIRE(done.ok());
  CHECK_FALSE(done.value());
  // Synchronous copies do not wait for stream work: they read the stale bytes.
  std::future<Status> read = start([&] {
    std::uint8_t first = 0;
    Status status = sim.copy_to_host(&first, destination.get(), 1, Device::cuda(0));
    return first == 0xA5 ? status : Status(ErrorCode::Internal, "the copy already ran");
  });
  CHECK(returned(read));
  // Other streams run on.
  const DeviceStream other{Device::cuda(0), 1};
  Result<std::unique_ptr<ops::DeviceEvent>> other_event = sim.record_event(other);
  REQUIRE(other_event.ok());
  std::future<Status> other_wait = start([&] { return other_event.value()->wait(); });
  CHECK(returned(other_wait));

  sim.resume(kStream);
  CHECK(read.get().ok());
  CHECK(other_wait.get().ok());
  REQUIRE(event.value()->wait().ok());
  done = event.value()->poll();
  CHECK((done.ok() && done.value()));
  CHECK(download<float>(sim, destination.get(), values.size()) == values);
  CHECK(sim.violations() == 0);
}

TEST_CASE("Every kind of misuse is a counted violation that enqueues nothing", "[sim_device]") {
  SimDeviceOps sim(2, 0us);
  std::uint64_t expected = 0;
  auto check_violation = [&](const Status& status, const std::string& words) {
    CHECK_FALSE(status.ok());
    CHECK(status.code() == ErrorCode::Internal);
    CHECK_THAT(std::string(status.message()), Catch::Contains(words));
    CHECK(sim.violations() == ++expected);
  };
  auto copy = [](void* destination, const void* source, std::size_t count) {
    return std::vector<CopySpec>{{.destination = destination, .source = source, .count = count}};
  };
  std::shared_ptr<void> device = sim.allocate_zeroed(256, Device::cuda(0));
  std::shared_ptr<void> other_device = sim.allocate_zeroed(256, Device::cuda(1));
  Result<std::shared_ptr<void>> pinned = sim.allocate_pinned(256);
  REQUIRE(pinned.ok());
  std::vector<float> host(64);
  std::shared_ptr<void> freed = sim.allocate_zeroed(256, Device::cuda(0));
  void* const dangling = freed.get();
  freed.reset();

  check_violation(sim.batched_copy(copy(device.get(), host.data(), 4), kStream),
                  "copy 0 source " + detail::str_cat(static_cast<void*>(host.data())) +
                      " (16 bytes) must be device memory of cuda:0, but is host memory");
  check_violation(sim.batched_copy(copy(other_device.get(), device.get(), 4), kStream),
                  "copy 0 destination");
  check_violation(sim.batched_copy(copy(other_device.get(), device.get(), 4), kStream),
                  "but is device memory of cuda:1");
  check_violation(sim.batched_copy(copy(device.get(), dangling, 4), kStream),
                  "but is freed device memory of cuda:0");
  check_violation(
      sim.batched_copy(copy(device.get(), static_cast<char*>(device.get()) + 4, 64), kStream),
      "crossing the bounds of the 256-byte device allocation of cuda:0");
  check_violation(sim.batched_copy(copy(pinned.value().get(), device.get(), 4), kStream),
                  "but is pinned host memory");
  auto* floats = static_cast<float*>(device.get());
  check_violation(
      sim.batched_copy(
          std::vector<CopySpec>{{.destination = floats, .source = floats + 32, .count = 4},
                                {.destination = floats + 2, .source = floats + 40, .count = 4}},
          kStream),
      "overlaps copy 1 destination");
  check_violation(sim.batched_copy(std::vector<CopySpec>{{.destination = floats,
                                                          .destination_type = DataType::Int32,
                                                          .source = floats,
                                                          .count = 4}},
                                   kStream),
                  "overlaps copy 0 source");
  check_violation(sim.fill_zero(host.data(), 8, kStream), "fill_zero: data");
  check_violation(sim.fill_zero(device.get(), 8, DeviceStream{Device::cuda(2), 0}),
                  "cuda:2 is not a simulated device");
  check_violation(sim.fill_zero(device.get(), 8, DeviceStream{Device::cuda(0), -1}),
                  "stream index -1");
  check_violation(sim.copy_to_host(other_device.get(), device.get(), 8, Device::cuda(0)),
                  "host " + detail::str_cat(other_device.get()) +
                      " (8 bytes) must be host memory, but is device memory of cuda:1");
  check_violation(sim.copy_to_device(host.data(), host.data() + 8, 8, Device::cuda(0)),
                  "copy_to_device: device_memory");
  check_violation(sim.copy_device_to_device(device.get(), device.get(), 8, Device::cuda(1)),
                  "must be device memory of cuda:1, but is device memory of cuda:0");
  check_violation(sim.copy_device_to_device(device.get(), dangling, 8, Device::cuda(0)),
                  "freed device memory");
  check_violation(sim.copy_async(host.data(), other_device.get(), 8, kStream),
                  "must be host memory or device memory of cuda:0, but is device memory of cuda:1");
  check_violation(sim.copy_async(dangling, host.data(), 8, kStream), "freed device memory");
  check_violation(sim.record_event(DeviceStream{Device::cpu(), 0}).status(), "cpu is not");

  // Empty ranges are always fine, whatever the pointers.
  CHECK(sim.fill_zero(host.data(), 0, kStream).ok());
  CHECK(sim.copy_to_host(nullptr, nullptr, 0, Device::cuda(0)).ok());
  CHECK(sim.copy_async(dangling, host.data(), 0, kStream).ok());
  CHECK(sim.batched_copy(copy(host.data(), dangling, 0), kStream).ok());
  CHECK(sim.violations() == expected);
  CHECK(sim.launches() == 0);
  REQUIRE(sim.synchronize(kStream).ok());
  CHECK(download<std::uint8_t>(sim, device.get(), 256) == std::vector<std::uint8_t>(256, 0));
}

TEST_CASE("Freeing device memory waits for its device's pending stream work", "[sim_device]") {
  SimDeviceOps sim(2, 0us);
  std::shared_ptr<void> memory = sim.allocate_zeroed(4096, Device::cuda(0));
  std::shared_ptr<void> elsewhere = sim.allocate_zeroed(64, Device::cuda(1));
  sim.pause(kStream);
  REQUIRE(sim.fill_zero(memory.get(), 4096, kStream).ok());
  Result<std::unique_ptr<ops::DeviceEvent>> event = sim.record_event(kStream);
  REQUIRE(event.ok());

  // Another device's memory is freed at once.
  std::future<Status> free_elsewhere = start([&] {
    elsewhere.reset();
    return Status();
  });
  CHECK(returned(free_elsewhere));
  std::atomic<bool> freed{false};
  std::thread releaser([&freed, owned = std::move(memory)]() mutable {
    owned.reset();
    freed = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(freed.load());
  Result<bool> done = event.value()->poll();
  CHECK((done.ok() && !done.value()));
  sim.resume(kStream);
  releaser.join();
  CHECK(freed.load());
  done = event.value()->poll();
  CHECK((done.ok() && done.value()));
  CHECK(free_elsewhere.get().ok());
  CHECK(sim.allocations_live() == 0);
  CHECK(sim.violations() == 0);
}

TEST_CASE("copy_async into pageable memory returns when done, into pinned memory at once",
          "[sim_device]") {
  SimDeviceOps sim(1, 5ms);
  std::vector<std::int32_t> values(256);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int32_t>(i) - 100;
  const std::vector<std::int32_t> original = values;
  const std::size_t bytes = values.size() * sizeof(std::int32_t);
  std::shared_ptr<void> device = allocate(sim, bytes);

  // A pageable source is staged by the call, so it may be overwritten at once.
  REQUIRE(sim.copy_async(device.get(), values.data(), bytes, kStream).ok());
  std::fill(values.begin(), values.end(), -1);
  std::vector<std::int32_t> back(values.size(), 0);
  REQUIRE(sim.copy_async(back.data(), device.get(), bytes, kStream).ok());
  CHECK(back == original);  // No synchronize: the copy returned when done.

  Result<std::shared_ptr<void>> pinned = sim.allocate_pinned(bytes);
  REQUIRE(pinned.ok());
  sim.pause(kStream);
  std::future<Status> download_async =
      start([&] { return sim.copy_async(pinned.value().get(), device.get(), bytes, kStream); });
  const bool returned_while_paused = returned(download_async);
  const auto* staged = static_cast<const std::int32_t*>(pinned.value().get());
  const std::uint8_t first_byte = *static_cast<const std::uint8_t*>(pinned.value().get());
  sim.resume(kStream);
  CHECK(returned_while_paused);
  CHECK(first_byte == 0xA5);  // Not copied yet.
  CHECK(download_async.get().ok());
  REQUIRE(sim.synchronize(kStream).ok());
  CHECK(std::vector<std::int32_t>(staged, staged + values.size()) == original);
  CHECK(sim.violations() == 0);
}

TEST_CASE("Destroying the device runs its queued work, even on a paused stream", "[sim_device]") {
  auto sim = std::make_unique<SimDeviceOps>(1, 1ms);
  sim->pause(kStream);
  Result<std::unique_ptr<ops::DeviceEvent>> event = sim->record_event(kStream);
  REQUIRE(event.ok());
  Result<bool> done = event.value()->poll();
  CHECK((done.ok() && !done.value()));
  sim.reset();
  done = event.value()->poll();  // The event outlives the device.
  CHECK((done.ok() && done.value()));
  CHECK(event.value()->wait().ok());
}

TEST_CASE("Threads on their own streams use the device concurrently", "[sim_device]") {
  SimDeviceOps sim(2, 50us);
  constexpr int kThreads = 4;
  std::vector<int> failures(kThreads, 0);  // One slot per thread; asserted after the join.
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const DeviceStream stream{Device::cuda(t % 2), t / 2};
      std::vector<double> values(100 + t, 1.5 * t);
      const std::size_t bytes = values.size() * sizeof(double);
      for (int round = 0; round < 20; ++round) {
        std::shared_ptr<void> device = sim.allocate_zeroed(bytes, stream.device);
        std::vector<double> back(values.size());
        const std::vector<CopySpec> scale = {{.destination = device.get(),
                                              .destination_type = DataType::Float64,
                                              .source = device.get(),
                                              .source_type = DataType::Float64,
                                              .count = values.size(),
                                              .factor = 2.0}};
        const bool ok = sim.copy_async(device.get(), values.data(), bytes, stream).ok() &&
                        sim.batched_copy(scale, stream).ok() &&
                        sim.copy_async(back.data(), device.get(), bytes, stream).ok();
        if (!ok || back != std::vector<double>(values.size(), 3.0 * t)) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failures == std::vector<int>(kThreads, 0));
  CHECK(sim.launches() == std::uint64_t{kThreads} * 20);
  CHECK(sim.allocations_live() == 0);
  CHECK(sim.violations() == 0);
}

}  // namespace
}  // namespace tutti
