// SPDX-License-Identifier: Apache-2.0
// Main of the device tests in the mpi suite: as test/support/mpi_main.cc, with the
// simulated device (two devices, streams that finish their work up to 200 µs late) installed
// as Tutti's DeviceOps, and its application streams as the tests' producer streams. A run
// fails if Tutti ever handed the device host memory, memory of another device or freed memory,
// or an unknown stream (SimDeviceOps::violations).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "ops/device_ops.h"
#include "src/common/check.h"
#include "test/support/device_test_util.h"
#include "test/support/mpi_catch.h"
#include "test/support/producer_stream.h"
#include "test/support/sim_device.h"

namespace tutti::test {
namespace {

SimDeviceOps* g_device = nullptr;  // main()'s, while the tests run.

// An application's stream of the simulated device: paused while held (Note [Simulated
// device], item 4).
class SimProducer final : public ProducerStream {
 public:
  SimProducer(void* handle, std::string name) : handle_(handle), name_(std::move(name)) {}
  void* handle() override { return handle_; }
  std::string name() const override { return name_; }
  void hold() override { g_device->pause_app(handle_, test_device().index); }
  void write(void* destination, const std::vector<std::byte>& bytes) override {
    const Status status = g_device->write_async(handle_, test_device().index, destination,
                                                bytes.data(), bytes.size());
    TUTTI_CHECK(status.ok(), "write_async: ", status.message());
  }
  void release() override { g_device->resume_app(handle_, test_device().index); }

 private:
  void* handle_;
  std::string name_;
};

}  // namespace

Device test_device() { return Device::cuda(0); }

std::vector<std::unique_ptr<ProducerStream>> producer_streams() {
  std::vector<std::unique_ptr<ProducerStream>> streams;
  streams.push_back(std::make_unique<SimProducer>(nullptr, "the legacy default stream"));
  streams.push_back(std::make_unique<SimProducer>(g_device->app_stream(test_device().index),
                                                  "a stream of the application"));
  return streams;
}

}  // namespace tutti::test

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, 1);  // Oracles run beside Tutti.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = 0;
  {
    tutti::test::SimDeviceOps device(2);
    tutti::ops::set_device_ops(&device);
    tutti::test::g_device = &device;
    failed = tutti::test::run_catch(argc, argv);
    if (device.violations() != 0) {
      std::fprintf(stderr, "rank %d: %d invalid device memory accesses (see above)\n", rank,
                   static_cast<int>(device.violations()));
      failed = 1;
    }
    tutti::test::g_device = nullptr;
    tutti::ops::set_device_ops(nullptr);
  }
  const int code = tutti::test::agree_on_failures(failed);
  MPI_Finalize();
  return code;
}
