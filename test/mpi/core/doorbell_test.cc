// SPDX-License-Identifier: Apache-2.0
// The coordinator's doorbell (Note [Doorbell] in ops/mpi/doorbell.h), on its own over the host's
// ranks: who gets one, a ring during a nap wakes the coordinator's waiting thread, a ring
// outside a nap does not, and the shared page leaves no name behind. The runtime's use of it
// (process sets without rank 0) runs in the process_set tests; its latency in
// examples/set_latency_benchmark.cc.
#include "ops/mpi/doorbell.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "test/support/ring_waiter.h"

namespace tutti::test {
namespace {

using ops::mpi::Doorbell;
using namespace std::chrono_literals;

// The doorbell of global rank 0 over MPI_COMM_WORLD's host (every test rank shares one host).
// `job_size` larger than the world stands for a job with ranks on other hosts.
std::unique_ptr<Doorbell> world_doorbell(int job_size = world_size()) {
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &host);
  std::unique_ptr<Doorbell> doorbell = Doorbell::create(host, world_rank(), 0, job_size);
  MPI_Comm_free(&host);
  return doorbell;
}

using Waiter = RingWaiter<Doorbell>;

TEST_CASE("Only the coordinator's host has a doorbell, and only with other ranks on it",
          "[doorbell]") {
  std::unique_ptr<Doorbell> doorbell = world_doorbell();
  if (world_size() == 1) {
    CHECK(doorbell == nullptr);
    return;
  }
  // POSIX shared memory lives in /dev/shm on Linux; without it there is no doorbell (and the
  // runtime goes on without one).
  if (!std::filesystem::exists("/dev/shm")) {
    CHECK(doorbell == nullptr);
    return;
  }
  REQUIRE(doorbell != nullptr);
  CHECK(doorbell->rung_here() == (world_rank() == 0));
  // Every rank shares the host and mapped the page: all of them ring (Note [Quiet naps]).
  CHECK(doorbell->every_rank_rings() == (world_rank() == 0));
  // The page's name is gone once every rank has mapped it: nothing is left in /dev/shm.
  if (world_rank() == 0) {
    const std::string prefix = "tutti-doorbell-" + std::to_string(getpid()) + "-";
    int left = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      if (entry.path().filename().string().starts_with(prefix)) ++left;
    }
    CHECK(left == 0);
  }
}

TEST_CASE("With ranks on other hosts the coordinator is not rung by every rank", "[doorbell]") {
  std::unique_ptr<Doorbell> doorbell = world_doorbell(world_size() + 1);
  if (world_size() == 1 || !std::filesystem::exists("/dev/shm")) return;
  REQUIRE(doorbell != nullptr);
  CHECK(doorbell->rung_here() == (world_rank() == 0));
  CHECK_FALSE(doorbell->every_rank_rings());
}

TEST_CASE("A ring during the coordinator's nap wakes its waiting thread; one outside does not",
          "[doorbell]") {
  std::unique_ptr<Doorbell> doorbell = world_doorbell();
  if (world_size() == 1 || !std::filesystem::exists("/dev/shm")) return;
  REQUIRE(doorbell != nullptr);
  const bool coordinator = world_rank() == 0;

  // Outside a nap: the last rank rings, and rank 0's waiting thread sleeps on.
  std::optional<Waiter> idle;
  if (coordinator) idle.emplace(*doorbell);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == world_size() - 1) doorbell->ring();
  MPI_Barrier(MPI_COMM_WORLD);
  if (coordinator) {
    bool in_time = true;
    // Long enough for a wake-up to have happened (a ring takes microseconds).
    CHECK_FALSE(idle->get(200ms, &in_time));
    CHECK_FALSE(in_time);
    CHECK(doorbell->rings_heard() == 0);
  }
  idle.reset();

  // During a nap each other rank rings in turn, and each ring wakes the waiting thread.
  doorbell = world_doorbell();  // stop_ring_waits() above is for good: a fresh one.
  REQUIRE(doorbell != nullptr);
  if (coordinator) doorbell->nap_begins();
  for (int ringer = 1; ringer < world_size(); ++ringer) {
    std::optional<Waiter> waiter;
    if (coordinator) {
      waiter.emplace(*doorbell);
      // Time for the thread to fall asleep on the futex, so that the ring has to wake it (a
      // ring before its first look would be found without one).
      std::this_thread::sleep_for(50ms);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == ringer) doorbell->ring();
    MPI_Barrier(MPI_COMM_WORLD);
    if (coordinator) {
      bool in_time = false;
      INFO("the ring of rank " << ringer);
      CHECK(waiter->get(60s, &in_time));
      CHECK(in_time);
      CHECK(doorbell->rings_heard() == static_cast<std::uint64_t>(ringer));
    }
  }
  if (coordinator) doorbell->nap_ends();

  if (coordinator) check_stop_ends_waits(*doorbell);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tutti::test
