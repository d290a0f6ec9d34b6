// SPDX-License-Identifier: Apache-2.0
// The coordinator's net bell (Note [Net bell] in ops/mpi/net_bell.h) on its own: when a remote
// rank rings, who gets a bell, a ring wakes the coordinator's waiting thread, datagrams that are
// not rings do not. Every test rank shares one host, so the ranks other than 0 are declared
// remote: their datagrams take the same path (the coordinator's address on this host's subnet)
// as on another host. The runtime's use of it across hosts runs in the cluster suite
// (test/cluster, case bell).
#include "ops/mpi/net_bell.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "test/support/ring_waiter.h"

namespace tutti::test {
namespace {

using ops::mpi::NetBell;
using ops::mpi::RingPolicy;
using namespace std::chrono_literals;

using Waiter = RingWaiter<NetBell>;

// `bytes` to the coordinator's port on this host, as a stranger would send them.
void send_to(std::uint16_t port, const void* bytes, std::size_t size) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  CHECK(sendto(fd, bytes, size, 0, reinterpret_cast<sockaddr*>(&address), sizeof address) ==
        static_cast<ssize_t>(size));
  close(fd);
}

TEST_CASE("A remote rank rings unless it heard from the coordinator within kQuietFor",
          "[net_bell]") {
  using Clock = RingPolicy::Clock;
  const Clock::time_point t0 = Clock::now();
  RingPolicy policy;
  CHECK(policy.due(t0));  // Nothing heard yet.
  policy.looked(t0);
  policy.heard();  // A message read on the look after t0's.
  CHECK_FALSE(policy.due(t0 + RingPolicy::kQuietFor - 1us));
  CHECK(policy.due(t0 + RingPolicy::kQuietFor));
  // Looks that find nothing do not count as hearing.
  policy.looked(t0 + 5ms);
  CHECK(policy.due(t0 + 5ms + 1us));
  // A message read after a long nap or op may be old: it counts from the last empty look.
  policy.looked(t0 + 10ms);
  policy.heard();  // Read at t0 + 60 ms.
  CHECK(policy.due(t0 + 60ms));
  CHECK_FALSE(policy.due(t0 + 10ms + RingPolicy::kQuietFor / 2));
}

TEST_CASE("Only the coordinator and the ranks on other hosts get a net bell", "[net_bell]") {
  // Every rank on the coordinator's host: no bell anywhere.
  CHECK(NetBell::create(MPI_COMM_WORLD, 0, /*remote=*/false) == nullptr);
  std::unique_ptr<NetBell> bell = NetBell::create(MPI_COMM_WORLD, 0, world_rank() != 0);
  if (world_size() == 1) {
    CHECK(bell == nullptr);
    return;
  }
  if (bell == nullptr) {
    // Only where this host has no IPv4 interface but loopback (its INFO line says so).
    WARN("no net bell on this host: no IPv4 address but loopback");
    return;
  }
  CHECK(bell->rung_here() == (world_rank() == 0));
  if (world_rank() == 0) CHECK(bell->port() != 0);
}

TEST_CASE("A ring wakes the coordinator's waiting thread; datagrams that are not rings do not",
          "[net_bell]") {
  std::unique_ptr<NetBell> bell = NetBell::create(MPI_COMM_WORLD, 0, world_rank() != 0);
  if (world_size() == 1 || bell == nullptr) return;
  const bool coordinator = world_rank() == 0;

  // A stranger's datagrams: a wrong token, and one of another length.
  if (coordinator) {
    Waiter waiter(*bell);
    const std::uint64_t wrong[2] = {0, 1};
    send_to(bell->port(), wrong, sizeof wrong);
    const char one = 'x';
    send_to(bell->port(), &one, 1);
    bool in_time = true;
    // Long enough for a wake-up to have happened (a datagram on this host takes microseconds).
    CHECK_FALSE(waiter.get(300ms, &in_time));
    CHECK_FALSE(in_time);
    CHECK(bell->rings_heard() == 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  // Each other rank rings in turn, and each ring wakes the waiting thread.
  bell = NetBell::create(MPI_COMM_WORLD, 0, world_rank() != 0);  // stop_ring_waits() is for good.
  REQUIRE(bell != nullptr);
  for (int ringer = 1; ringer < world_size(); ++ringer) {
    std::optional<Waiter> waiter;
    if (coordinator) waiter.emplace(*bell);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == ringer) bell->ring();
    if (coordinator) {
      bool in_time = false;
      INFO("the ring of rank " << ringer);
      CHECK(waiter->get(60s, &in_time));
      CHECK(in_time);
      CHECK(bell->rings_heard() == static_cast<std::uint64_t>(ringer));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (coordinator) {
    std::vector<int> expected;
    for (int r = 1; r < world_size(); ++r) expected.push_back(r);
    CHECK(bell->ranks_heard() == expected);
    check_stop_ends_waits(*bell);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tutti::test
