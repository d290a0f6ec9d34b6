// SPDX-License-Identifier: Apache-2.0
// The shared-memory backend's routes by size class (Note [Host transport by size] in
// ops/shm/shm_backend.h), on the backend itself: under each of the four routes, collectives
// up to 64 KiB and larger ones give their closed-form results, and exactly those the route
// keeps on shared memory use its ring (the ring's chunk count moves); the others go over MPI.
// The autotuner's choosing of a route is tested in test/unit/core/autotune_test.cc and, under
// mpiexec, test/mpi/core/autotune_test.cc.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "ops/mpi/mpi_comm.h"
#include "ops/shm/shm_backend.h"
#include "test/support/mpi_test_util.h"

namespace tutti::test {
namespace {

using ops::HostRoutes;

// Float counts: the smallest collective, the largest of class 0 (64 KiB exactly), the
// smallest of class 1, and one of several ring chunks.
const std::vector<std::size_t> kCounts = {4, 16384, 16385, 300001};

std::unique_ptr<ops::Backend> host_backend() {
  Result<ops::mpi::MpiComm> comm = ops::mpi::MpiComm::duplicate(MPI_COMM_WORLD);
  REQUIRE(comm.ok());
  ops::BackendOptions options;
  options.host_transport = ops::HostTransport::Shm;
  Result<std::unique_ptr<ops::Backend>> backend =
      ops::shm::create_host_backend(std::move(comm).value(), options);
  REQUIRE(backend.ok());
  return std::move(backend).value();
}

// Whether a collective of `bytes` in total should have used the ring under `routes`.
bool on_ring(HostRoutes routes, std::size_t bytes) {
  return ((routes >> ops::host_size_class(bytes)) & 1u) == 0;
}

TEST_CASE("Each size class runs where the route says, with the same results", "[shm]") {
  std::unique_ptr<ops::Backend> backend = host_backend();
  const int n = world_size();
  const int me = world_rank();
  if (n == 1) {  // One rank has nothing to share: the MPI backend, with no choice.
    CHECK_FALSE(backend->routes_host());
    return;
  }
  auto* shm = dynamic_cast<ops::shm::ShmBackend*>(backend.get());
  REQUIRE(shm != nullptr);
  CHECK(shm->routes_host());
  bool calls_ok = true;
  bool values_ok = true;
  bool routes_ok = true;
  std::string failure;
  for (HostRoutes routes = 0; routes <= ops::kAllHostRoutes; ++routes) {
    shm->route_host(routes);
    for (std::size_t count : kCounts) {
      const std::size_t bytes = count * sizeof(float);
      const std::string what =
          " routes " + std::to_string(routes) + " count " + std::to_string(count);
      // Whether a fused reduction may be handed over unpacked follows the route too.
      if (shm->reduces_tensors(bytes) != on_ring(routes, bytes)) {
        routes_ok = false;
        failure += "reduces_tensors" + what + ";";
      }
      // Allreduce (Sum): element i of rank r is r + 1 + i % 5; the sum n(n+1)/2 + n (i % 5).
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(me + 1 + i % 5);
      std::uint64_t before = shm->chunks_taken();
      // A failed call fails on every rank alike, so the rest still pair up.
      calls_ok =
          calls_ok && shm->allreduce(data.data(), count, DataType::Float32, ops::WireOp::Sum).ok();
      if ((shm->chunks_taken() != before) != on_ring(routes, bytes)) {
        routes_ok = false;
        failure += "allreduce" + what + ";";
      }
      for (std::size_t i = 0; i < count; ++i) {
        values_ok = values_ok && data[i] == static_cast<float>(n * (n + 1) / 2 + n * (i % 5));
      }
      // Broadcast from the last rank: element i is 7 + i % 3.
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = me == n - 1 ? static_cast<float>(7 + i % 3) : -1.0f;
      }
      before = shm->chunks_taken();
      calls_ok = calls_ok && shm->broadcast(data.data(), count, DataType::Float32, n - 1).ok();
      if ((shm->chunks_taken() != before) != on_ring(routes, bytes)) {
        routes_ok = false;
        failure += "broadcast" + what + ";";
      }
      for (std::size_t i = 0; i < count; ++i)
        values_ok = values_ok && data[i] == static_cast<float>(7 + i % 3);
      // Allgather of `count` floats in all: rank r gives its share (the last rank the rest),
      // element j of the whole being j % 11; the class is the whole's.
      const std::vector<std::size_t> counts = [&] {
        std::vector<std::size_t> c(static_cast<std::size_t>(n),
                                   count / static_cast<std::size_t>(n));
        c.back() += count % static_cast<std::size_t>(n);
        return c;
      }();
      const std::size_t first = count / static_cast<std::size_t>(n) * static_cast<std::size_t>(me);
      std::vector<float> mine(counts[static_cast<std::size_t>(me)]);
      for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<float>((first + j) % 11);
      std::vector<float> whole(count, -1.0f);
      before = shm->chunks_taken();
      calls_ok =
          calls_ok && shm->allgatherv(mine.data(), whole.data(), counts, DataType::Float32).ok();
      if ((shm->chunks_taken() != before) != on_ring(routes, bytes)) {
        routes_ok = false;
        failure += "allgatherv" + what + ";";
      }
      for (std::size_t j = 0; j < count; ++j)
        values_ok = values_ok && whole[j] == static_cast<float>(j % 11);
    }
  }
  INFO(failure);
  CHECK(all_ranks(calls_ok));
  CHECK(all_ranks(routes_ok));
  CHECK(all_ranks(values_ok));
}

}  // namespace
}  // namespace tutti::test
