// SPDX-License-Identifier: Apache-2.0
// The NCCL backend over device buffers: every op and dtype against closed forms, at world size
// 1 (and at N ranks where each rank has a GPU of its own: NCCL refuses two ranks on one
// device), bootstrapped over the world's MPI backend as core does through the registry.
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

int devices_needed(int local_size) { return local_size; }  // A GPU per rank.

namespace {

// The world's MPI backend and an NCCL backend bootstrapped over it. Collective.
struct NcclWorld {
  std::unique_ptr<ops::mpi::MpiBackend> host;
  std::unique_ptr<ops::Backend> nccl;

  NcclWorld() {
    Result<ops::mpi::MpiComm> comm = ops::mpi::MpiComm::duplicate(MPI_COMM_WORLD);
    REQUIRE(all_ranks(comm.ok()));
    host = std::make_unique<ops::mpi::MpiBackend>(std::move(comm).value());
    Result<std::unique_ptr<ops::Backend>> created =
        ops::create_device_backend(*host, my_stream(), ops::DeviceBackendKind::Nccl);
    INFO(std::string(created.status().message()));
    REQUIRE(all_ranks(created.ok()));
    nccl = std::move(created).value();
  }
};

TEST_CASE("the registry picks NCCL when every rank has a GPU of its own", "[nccl]") {
  REQUIRE(ops::built_with_nccl());
  Result<ops::mpi::MpiComm> comm = ops::mpi::MpiComm::duplicate(MPI_COMM_WORLD);
  REQUIRE(all_ranks(comm.ok()));
  ops::mpi::MpiBackend host(std::move(comm).value());
  Result<std::unique_ptr<ops::Backend>> chosen = ops::create_device_backend(host, my_stream());
  REQUIRE(all_ranks(chosen.ok()));
  CHECK(all_ranks(chosen.value()->name() == "NCCL"));
  CHECK(
      all_ranks(chosen.value()->rank() == world_rank() && chosen.value()->size() == world_size()));
}

TEST_CASE("NCCL allreduce: every dtype and op, widened 16-bit integers included",
          "[nccl][allreduce]") {
  NcclWorld world;
  check_allreduce(*world.nccl, kEveryDtype);
}

TEST_CASE("NCCL allgatherv: even and uneven counts, every dtype", "[nccl][allgather]") {
  NcclWorld world;
  check_allgatherv(*world.nccl, kEveryDtype);
}

TEST_CASE("NCCL broadcast from every root, every dtype", "[nccl][broadcast]") {
  NcclWorld world;
  check_broadcast(*world.nccl, kEveryDtype);
}

TEST_CASE("NCCL alltoallv with zero and uneven splits, every dtype", "[nccl][alltoall]") {
  NcclWorld world;
  check_alltoallv(*world.nccl, kEveryDtype);
}

TEST_CASE("NCCL reducescatter: even and uneven splits, every numeric dtype",
          "[nccl][reducescatter]") {
  NcclWorld world;
  std::vector<DataType> numeric = kEveryDtype;
  numeric.pop_back();  // Bool: Sum is not defined for it.
  check_reducescatter(*world.nccl, numeric);
}

TEST_CASE("NCCL reduce, gatherv and scatterv at every root, every dtype", "[nccl][rooted]") {
  NcclWorld world;
  check_rooted(*world.nccl, kEveryDtype);
}

TEST_CASE("NCCL carries core's fused float16 Average and completes through its event",
          "[nccl][fusion]") {
  NcclWorld world;
  check_fused_average(*world.nccl);
}

TEST_CASE("NCCL barrier completes; Adasum and bool sums are refused on every rank", "[nccl]") {
  NcclWorld world;
  Status barrier = world.nccl->barrier();
  if (barrier.ok()) barrier = finish(*world.nccl);
  CHECK(all_ranks(barrier.ok()));
  DeviceBuffer data(64);
  const std::size_t counts[] = {16};
  const Status adasum = world.nccl->adasum(data.get(), counts, DataType::Float32);
  CHECK(all_ranks(adasum.code() == ErrorCode::InvalidArgument &&
                  adasum.message() == "ADASUM is not supported on CUDA tensors"));
  const Status bool_sum = world.nccl->allreduce(data.get(), 4, DataType::Bool, ops::WireOp::Sum);
  CHECK(all_ranks(bool_sum.code() == ErrorCode::InvalidArgument));
  CHECK(all_ranks(world.nccl->async_error().ok()));
}

}  // namespace
}  // namespace tutti::test
