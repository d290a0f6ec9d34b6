// SPDX-License-Identifier: Apache-2.0
// Main of the device tests in the mpi suite: as test/support/mpi_main.cc, with the
// simulated device (two devices, streams that finish their work up to 200 µs late) installed
// as Tutti's DeviceOps. A run fails if Tutti ever handed the device host memory, memory of
// another device or freed memory (SimDeviceOps::violations).
#include <cstdio>

#include <mpi.h>

#include "ops/device_ops.h"
#include "test/support/device_test_util.h"
#include "test/support/mpi_catch.h"
#include "test/support/sim_device.h"

namespace tutti::test {

Device test_device() { return Device::cuda(0); }

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
    failed = tutti::test::run_catch(argc, argv);
    if (device.violations() != 0) {
      std::fprintf(stderr, "rank %d: %d invalid device memory accesses (see above)\n", rank,
                   static_cast<int>(device.violations()));
      failed = 1;
    }
    tutti::ops::set_device_ops(nullptr);
  }
  const int code = tutti::test::agree_on_failures(failed);
  MPI_Finalize();
  return code;
}
