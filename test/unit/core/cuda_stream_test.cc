// SPDX-License-Identifier: Apache-2.0
// tutti/cuda.h's current stream (per thread, StreamGuard, InvalidArgument without CUDA) and
// the simulated device's application streams, the pieces of Note [Stream ordering] that need
// no runtime: a producer's write lands late, record_ready + wait_event order a stream after it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "ops/device_ops.h"
#include "test/support/sim_device.h"
#include "tutti/cuda.h"
#include "tutti/runtime.h"

namespace tutti {
namespace {

using ops::DeviceStream;
using test::SimDeviceOps;
using namespace std::chrono_literals;

// Installs `sim` as the process's DeviceOps for a scope.
struct Installed {
  explicit Installed(SimDeviceOps& sim) { ops::set_device_ops(&sim); }
  ~Installed() { ops::set_device_ops(nullptr); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;
};

// A stand-in for a cudaStream_t that no DeviceOps knows.
void* const kUnknownStream = reinterpret_cast<void*>(std::uintptr_t{0x1234});

TEST_CASE("The current stream is per thread, nullptr by default, scoped by StreamGuard",
          "[cuda_stream]") {
  SimDeviceOps sim(1);
  Installed installed(sim);
  void* const first = sim.app_stream(0, 0);
  void* const second = sim.app_stream(0, 1);
  CHECK(first != second);
  CHECK(cuda::current_stream() == nullptr);
  cuda::set_current_stream(first);
  CHECK(cuda::current_stream() == first);
  void* seen_elsewhere = first;
  std::thread([&] { seen_elsewhere = cuda::current_stream(); }).join();
  CHECK(seen_elsewhere == nullptr);  // Another thread keeps its own default.
  {
    cuda::StreamGuard outer(second);
    CHECK(cuda::current_stream() == second);
    {
      cuda::StreamGuard inner(nullptr);
      CHECK(cuda::current_stream() == nullptr);
    }
    CHECK(cuda::current_stream() == second);
  }
  CHECK(cuda::current_stream() == first);
  cuda::set_current_stream(nullptr);
  CHECK(sim.violations() == 0);
}

TEST_CASE("Without CUDA a non-null stream is InvalidArgument; a guard that throws changes nothing",
          "[cuda_stream]") {
  if (cuda_built()) return;  // A CUDA build accepts any stream; its ops check it.
  CHECK_NOTHROW(cuda::set_current_stream(nullptr));
  try {
    cuda::set_current_stream(kUnknownStream);
    FAIL("a stream was accepted by a build without CUDA");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("built without CUDA") != std::string::npos);
  }
  CHECK(cuda::current_stream() == nullptr);
  try {
    cuda::StreamGuard guard(kUnknownStream);
    FAIL("a StreamGuard accepted a stream in a build without CUDA");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
  }
  CHECK(cuda::current_stream() == nullptr);
}

TEST_CASE("A producer's write lands late, and wait_event orders a stream after it",
          "[cuda_stream][sim_device]") {
  SimDeviceOps sim(2);
  const DeviceStream tutti_stream{Device::cuda(0), 0};
  for (void* producer : {static_cast<void*>(nullptr), sim.app_stream(0)}) {
    const std::vector<float> values = {1.5f, -2.0f, 3.25f, 8.0f};
    Result<std::shared_ptr<void>> source = sim.allocate(16, Device::cuda(0));
    Result<std::shared_ptr<void>> destination = sim.allocate(16, Device::cuda(0));
    REQUIRE((source.ok() && destination.ok()));
    sim.pause_app(producer, 0);
    REQUIRE(sim.write_async(producer, 0, source.value().get(), values.data(), 16).ok());
    std::this_thread::sleep_for(5ms);
    std::vector<float> now(4);
    REQUIRE(sim.copy_to_host(now.data(), source.value().get(), 16, Device::cuda(0)).ok());
    CHECK(now != values);  // Not landed: the producer is held.
    Result<std::unique_ptr<ops::DeviceEvent>> ready = sim.record_ready(producer, Device::cuda(0));
    REQUIRE(ready.ok());
    CHECK(!ready.value()->poll().value());
    REQUIRE(sim.wait_event(*ready.value(), tutti_stream).ok());
    ready.value().reset();  // The wait holds on to what it waits for.
    const ops::CopySpec copy{
        .destination = destination.value().get(), .source = source.value().get(), .count = 4};
    REQUIRE(sim.batched_copy(std::span<const ops::CopySpec>(&copy, 1), tutti_stream).ok());
    Result<std::unique_ptr<ops::DeviceEvent>> copied = sim.record_event(tutti_stream);
    REQUIRE(copied.ok());
    std::this_thread::sleep_for(5ms);
    CHECK(!copied.value()->poll().value());  // Behind the producer on the device.
    sim.resume_app(producer, 0);
    REQUIRE(copied.value()->wait().ok());
    std::vector<float> got(4);
    REQUIRE(sim.copy_to_host(got.data(), destination.value().get(), 16, Device::cuda(0)).ok());
    CHECK(got == values);
  }
  CHECK(sim.violations() == 0);
}

TEST_CASE("Unknown streams, streams of another device and foreign events are violations",
          "[cuda_stream][sim_device]") {
  SimDeviceOps sim(2);
  void* const on_one = sim.app_stream(1);
  CHECK(sim.check_stream(nullptr).ok());
  CHECK(sim.check_stream(on_one).ok());
  CHECK(sim.check_stream(kUnknownStream).code() == ErrorCode::Internal);
  CHECK(sim.record_ready(kUnknownStream, Device::cuda(0)).status().code() == ErrorCode::Internal);
  CHECK(sim.record_ready(on_one, Device::cuda(0)).status().code() == ErrorCode::Internal);
  CHECK(sim.record_ready(nullptr, Device::cuda(2)).status().code() == ErrorCode::Internal);
  struct Foreign final : ops::DeviceEvent {
    Result<bool> poll() override { return true; }
    Status wait() override { return Status(); }
  } foreign;
  CHECK(sim.wait_event(foreign, DeviceStream{Device::cuda(0), 0}).code() == ErrorCode::Internal);
  CHECK(sim.violations() == 5);
}

}  // namespace
}  // namespace tutti
