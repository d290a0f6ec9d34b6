// SPDX-License-Identifier: Apache-2.0
// The shared-memory backend's stores (Note [Streaming stores] in ops/shm/staging.h), on the
// backend itself: with ordinary stores, streaming stores and the measured choice, every
// collective that stages through the ring gives its closed-form result at sizes of one and of
// several chunks, and the stores the option names are the ones used (the backend counts the
// collectives it staged with streaming stores). The measured choice's rules are tested in
// test/unit/core/staging_test.cc; the public collectives under TUTTI_SHM_STREAMING_STORES=1 by
// `shm np=3 streaming`.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "ops/mpi/mpi_comm.h"
#include "ops/shm/shm_backend.h"
#include "ops/shm/staging.h"
#include "test/support/mpi_test_util.h"

namespace tutti::test {
namespace {

using ops::ShmStores;

std::unique_ptr<ops::Backend> host_backend(ShmStores stores) {
  Result<ops::mpi::MpiComm> comm = ops::mpi::MpiComm::duplicate(MPI_COMM_WORLD);
  REQUIRE(comm.ok());
  ops::BackendOptions options;
  options.host_transport = ops::HostTransport::Shm;
  options.shm_stores = stores;
  Result<std::unique_ptr<ops::Backend>> backend =
      ops::shm::create_host_backend(std::move(comm).value(), options);
  REQUIRE(backend.ok());
  return std::move(backend).value();
}

// Counts of `total` floats per rank: equal shares, the last rank the rest.
std::vector<std::size_t> shares(std::size_t total, int n) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), total / static_cast<std::size_t>(n));
  counts.back() += total % static_cast<std::size_t>(n);
  return counts;
}

TEST_CASE("Every staging collective gives its closed form under each choice of stores", "[shm]") {
  const ShmStores stores = GENERATE(ShmStores::Cached, ShmStores::Streaming, ShmStores::Auto);
  std::unique_ptr<ops::Backend> backend = host_backend(stores);
  const int n = world_size();
  const int me = world_rank();
  if (n == 1) {  // One rank has nothing to share: the MPI backend, with no stores to choose.
    CHECK(dynamic_cast<ops::shm::ShmBackend*>(backend.get()) == nullptr);
    return;
  }
  auto* shm = dynamic_cast<ops::shm::ShmBackend*>(backend.get());
  REQUIRE(shm != nullptr);
  bool calls_ok = true;
  bool values_ok = true;
  std::string failure;
  // One chunk (4 KiB + 4 B: past the one-round path), and several (300001 floats, 1.2 MB,
  // which auto measures), odd so that shares and staged pieces end mid-line.
  int collectives = 0;
  for (std::size_t count : {std::size_t{1025}, std::size_t{300001}}) {
    const std::string what = " count " + std::to_string(count) + ";";
    // Allreduce (Sum): element i of rank r is r + 1 + i % 5.
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(me + 1 + i % 5);
    calls_ok =
        calls_ok && shm->allreduce(data.data(), count, DataType::Float32, ops::WireOp::Sum).ok();
    for (std::size_t i = 0; i < count; ++i) {
      if (data[i] != static_cast<float>(n * (n + 1) / 2 + n * (i % 5))) {
        values_ok = false;
        failure += "allreduce" + what;
        break;
      }
    }
    // Reduce (Sum) to rank 0 of the same inputs.
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(me + 1 + i % 5);
    std::vector<float> reduced(count, -1.0f);
    calls_ok = calls_ok && shm->reduce(data.data(), reduced.data(), count, DataType::Float32,
                                       ops::WireOp::Sum, 0)
                               .ok();
    for (std::size_t i = 0; i < count && me == 0; ++i) {
      if (reduced[i] != static_cast<float>(n * (n + 1) / 2 + n * (i % 5))) {
        values_ok = false;
        failure += "reduce" + what;
        break;
      }
    }
    // Broadcast from the last rank: element i is 7 + i % 3.
    for (std::size_t i = 0; i < count; ++i) {
      data[i] = me == n - 1 ? static_cast<float>(7 + i % 3) : -1.0f;
    }
    calls_ok = calls_ok && shm->broadcast(data.data(), count, DataType::Float32, n - 1).ok();
    for (std::size_t i = 0; i < count; ++i) {
      if (data[i] != static_cast<float>(7 + i % 3)) {
        values_ok = false;
        failure += "broadcast" + what;
        break;
      }
    }
    // Allgather and gather (to rank 0) of `count` floats in all, element j being j % 11.
    const std::vector<std::size_t> counts = shares(count, n);
    const std::size_t first = count / static_cast<std::size_t>(n) * static_cast<std::size_t>(me);
    std::vector<float> mine(counts[static_cast<std::size_t>(me)]);
    for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<float>((first + j) % 11);
    std::vector<float> whole(count, -1.0f);
    calls_ok =
        calls_ok && shm->allgatherv(mine.data(), whole.data(), counts, DataType::Float32).ok();
    std::vector<float> gathered(count, -1.0f);
    calls_ok =
        calls_ok && shm->gatherv(mine.data(), gathered.data(), counts, DataType::Float32, 0).ok();
    for (std::size_t j = 0; j < count; ++j) {
      if (whole[j] != static_cast<float>(j % 11) ||
          (me == 0 && gathered[j] != static_cast<float>(j % 11))) {
        values_ok = false;
        failure += "allgatherv or gatherv" + what;
        break;
      }
    }
    // Scatter from rank 0 of the whole (j % 11): each rank gets its share back.
    std::vector<float> part(counts[static_cast<std::size_t>(me)], -1.0f);
    calls_ok =
        calls_ok && shm->scatterv(whole.data(), counts, part.data(), DataType::Float32, 0).ok();
    // Reducescatter (Sum) of every rank's whole (j % 11 + r): rank r's share of the sums.
    std::vector<float> input(count);
    for (std::size_t j = 0; j < count; ++j) input[j] = static_cast<float>(j % 11 + me);
    std::vector<float> scattered(counts[static_cast<std::size_t>(me)], -1.0f);
    calls_ok = calls_ok && shm->reducescatter(input.data(), scattered.data(), counts,
                                              DataType::Float32, ops::WireOp::Sum)
                               .ok();
    for (std::size_t j = 0; j < part.size(); ++j) {
      const std::size_t at = first + j;
      if (part[j] != static_cast<float>(at % 11) ||
          scattered[j] != static_cast<float>(n * (at % 11) + n * (n - 1) / 2)) {
        values_ok = false;
        failure += "scatterv or reducescatter" + what;
        break;
      }
    }
    collectives += 7;
  }
  // One more allreduce and two more allgathervs of the measured size: a third measured
  // collective for the reductions and for the allgathers (a gather to a root is a family of its
  // own), the one auto stages with streaming stores (below).
  {
    constexpr std::size_t kCount = 300001;
    std::vector<float> data(kCount, static_cast<float>(me + 1));
    calls_ok =
        calls_ok && shm->allreduce(data.data(), kCount, DataType::Float32, ops::WireOp::Sum).ok();
    const std::vector<std::size_t> counts = shares(kCount, n);
    std::vector<float> mine(counts[static_cast<std::size_t>(me)], static_cast<float>(me));
    std::vector<float> whole(kCount, -1.0f);
    calls_ok =
        calls_ok && shm->allgatherv(mine.data(), whole.data(), counts, DataType::Float32).ok();
    std::fill(whole.begin(), whole.end(), -1.0f);
    calls_ok =
        calls_ok && shm->allgatherv(mine.data(), whole.data(), counts, DataType::Float32).ok();
    const std::size_t share = kCount / static_cast<std::size_t>(n);
    for (std::size_t j = 0; j < kCount; ++j) {
      const std::size_t owner = std::min(j / share, static_cast<std::size_t>(n - 1));
      if (data[j] != static_cast<float>(n * (n + 1) / 2) || whole[j] != static_cast<float>(owner)) {
        values_ok = false;
        failure += "third allreduce or allgatherv;";
        break;
      }
    }
    collectives += 3;
  }
  INFO(failure);
  CHECK(all_ranks(calls_ok));
  CHECK(all_ranks(values_ok));
  // Ordinary stores stream nothing; streaming stores stage every collective so (a broadcast's
  // or a scatter's non-roots and a gather's root stage nothing but still count). The measured
  // choice looks at collectives of at least kMeasuredBytes only (here the 1.2 MB ones), takes
  // each family's first as a warm-up with ordinary stores, then measures ordinary stores on its
  // second and streaming ones on its third: the third of the reductions (the last allreduce)
  // and of the allgathers (the last allgatherv) streamed.
  const std::uint64_t streamed = shm->streamed();
  if (stores == ShmStores::Cached) CHECK(streamed == 0);
  if (stores == ShmStores::Streaming) CHECK(streamed == static_cast<std::uint64_t>(collectives));
  if (stores == ShmStores::Auto) CHECK(streamed == 2);
}

TEST_CASE("Every rank chooses its stores from host rank 0's costs", "[shm]") {
  std::unique_ptr<ops::Backend> backend = host_backend(ShmStores::Auto);
  const int n = world_size();
  const int me = world_rank();
  auto* shm = dynamic_cast<ops::shm::ShmBackend*>(backend.get());
  if (n == 1) {
    CHECK(shm == nullptr);
    return;
  }
  REQUIRE(shm != nullptr);
  // Enough measured allreduces for two tries of the kind not in use whatever the costs (Note
  // [How often the other kind is tried]), each of (r + 1)s, just over the smallest measured
  // size: their sum is n (n + 1) / 2.
  constexpr int kAllreduces = 3 + 2 * static_cast<int>(ops::shm::StagingChoice::kMaxExplorePeriod);
  constexpr std::size_t kCount = ops::shm::StagingChoice::kMeasuredBytes / sizeof(float) + 1;
  std::vector<float> data(kCount);
  bool ok = true;
  for (int i = 0; i < kAllreduces; ++i) {
    std::fill(data.begin(), data.end(), static_cast<float>(me + 1));
    ok = ok && shm->allreduce(data.data(), kCount, DataType::Float32, ops::WireOp::Sum).ok();
    ok = ok && data.front() == static_cast<float>(n * (n + 1) / 2) &&
         data.back() == static_cast<float>(n * (n + 1) / 2);
  }
  CHECK(all_ranks(ok));
  // A reduction reads every rank's slot, so rank 0's cost of collective i - 2 is on its board
  // when any rank decides collective i: no rank falls back on its own, and all choose alike.
  CHECK(shm->reductions_own_costs() == 0);
  std::vector<unsigned long long> streamed(static_cast<std::size_t>(n));
  const unsigned long long mine = shm->streamed();
  MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, streamed.data(), 1, MPI_UNSIGNED_LONG_LONG,
                MPI_COMM_WORLD);
  CHECK(std::count(streamed.begin(), streamed.end(), streamed.front()) == n);
}

}  // namespace
}  // namespace tutti::test
