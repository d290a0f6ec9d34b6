// SPDX-License-Identifier: Apache-2.0
// Main of the MPI gpu tests. The test owns MPI, as in the mpi suite, and every rank's failures
// reach the log (Note [Every rank's failures] in test/support/mpi_catch.h). Every rank exits 77
// (Meson's SKIP) when some host has fewer CUDA devices than the binary needs (devices_needed), else
// rank r uses device local_rank % count and every rank exits with the same code.
#include <cstdio>

#include <cuda_runtime.h>
#include <mpi.h>

#include "test/gpu/gpu_test_util.h"
#include "test/support/mpi_catch.h"

namespace tutti::test {

// The device gpu_mpi_main selected for this rank (device_collectives_test.cc's tensors).
Device test_device() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return Device::cuda(device);
}

}  // namespace tutti::test

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, 1);  // Oracles run beside Tutti.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_rank = 0;
  int local_size = 1;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  int skip = count < tutti::test::devices_needed(local_size) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (skip != 0) {
    if (rank == 0) {
      std::printf("no CUDA device, or fewer than %d per host: skipping\n",
                  tutti::test::devices_needed(local_size));
    }
    MPI_Finalize();
    return tutti::test::kSkipExitCode;
  }
  tutti::test::cuda_check(cudaSetDevice(local_rank % count), "cudaSetDevice");

  const int code = tutti::test::agree_on_failures(tutti::test::run_catch(argc, argv));
  MPI_Finalize();
  return code;
}
