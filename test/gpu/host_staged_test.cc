// SPDX-License-Identifier: Apache-2.0
// MPI over device buffers through host staging, at 1-4 ranks sharing one GPU: every op
// against closed forms, core's fused Average path, and the registry's choice of this backend
// when ranks share a device (NCCL would refuse them).
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <mpi.h>

#include "ops/mpi/mpi_backend.h"
#include "ops/mpi/mpi_comm.h"
#include "ops/registry.h"
#include "test/gpu/backend_cases.h"

namespace tutti::test {
namespace {

// The MPI backend carries Float16/BFloat16 as raw words: core widens them before reductions.
const std::vector<DataType> kReducible = {DataType::UInt8,   DataType::Int8,    DataType::UInt16,
                                          DataType::Int16,   DataType::Int32,   DataType::Int64,
                                          DataType::Float32, DataType::Float64, DataType::Bool};

struct StagedWorld {
  std::unique_ptr<ops::mpi::MpiBackend> host;
  std::unique_ptr<ops::Backend> staged;

  StagedWorld() {
    Result<ops::mpi::MpiComm> comm = ops::mpi::MpiComm::duplicate(MPI_COMM_WORLD);
    REQUIRE(all_ranks(comm.ok()));
    host = std::make_unique<ops::mpi::MpiBackend>(std::move(comm).value());
    Result<std::unique_ptr<ops::Backend>> created =
        ops::create_device_backend(*host, my_stream(), ops::DeviceBackendKind::HostStaged);
    REQUIRE(all_ranks(created.ok()));
    staged = std::move(created).value();
  }
};

TEST_CASE("the registry stages through the host when ranks share a GPU", "[staged]") {
  Result<ops::mpi::MpiComm> comm = ops::mpi::MpiComm::duplicate(MPI_COMM_WORLD);
  REQUIRE(all_ranks(comm.ok()));
  ops::mpi::MpiBackend host(std::move(comm).value());
  Result<std::unique_ptr<ops::Backend>> chosen = ops::create_device_backend(host, my_stream());
  INFO(std::string(chosen.status().message()));
  REQUIRE(all_ranks(chosen.ok()));
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  int local_size = 0;
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  int shared = local_size > devices ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const bool nccl = ops::built_with_nccl() && shared == 0;
  CHECK(all_ranks(chosen.value()->name() == (nccl ? "NCCL" : "MPI (host-staged device buffers)")));
  if (shared != 0) {
    const Result<std::unique_ptr<ops::Backend>> refused =
        ops::create_device_backend(host, my_stream(), ops::DeviceBackendKind::Nccl);
    CHECK(all_ranks(refused.status().code() == ErrorCode::InvalidArgument));
  }
}

TEST_CASE("host-staged allreduce: every dtype MPI reduces, every op", "[staged][allreduce]") {
  StagedWorld world;
  check_allreduce(*world.staged, kReducible);
}

TEST_CASE("host-staged allgatherv, broadcast and alltoallv move every dtype", "[staged]") {
  StagedWorld world;
  check_allgatherv(*world.staged, kEveryDtype);
  check_broadcast(*world.staged, kEveryDtype);
  check_alltoallv(*world.staged, kEveryDtype);
}

TEST_CASE("host-staged reducescatter: even and uneven splits", "[staged][reducescatter]") {
  StagedWorld world;
  std::vector<DataType> numeric = kReducible;
  numeric.pop_back();  // Bool: Sum is not defined for it.
  check_reducescatter(*world.staged, numeric);
}

TEST_CASE("host-staged reduce, gatherv and scatterv at every root", "[staged][rooted]") {
  StagedWorld world;
  check_rooted(*world.staged, kReducible);
}

TEST_CASE("host-staged carries core's fused float16 Average and completes through its event",
          "[staged][fusion]") {
  StagedWorld world;
  check_fused_average(*world.staged);
  CHECK(all_ranks(world.staged->barrier().ok()));
}

}  // namespace
}  // namespace tutti::test
