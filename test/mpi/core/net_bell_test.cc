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

// The bell of a job whose ranks other than 0 are declared remote: they send to rank 0's address
// on this host's subnet, which is also theirs.
std::unique_ptr<NetBell> remote_bell() {
  return NetBell::create(MPI_COMM_WORLD, 0, world_rank() != 0, /*own_addresses_allowed=*/true);
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

// A dotted IPv4 address in network byte order.
std::uint32_t ip(const char* dotted) {
  in_addr address{};
  REQUIRE(inet_pton(AF_INET, dotted, &address) == 1);
  return address.s_addr;
}

TEST_CASE("A remote rank rings the coordinator's address on its subnet, never its own host",
          "[net_bell]") {
  const std::uint32_t mask16 = ip("255.255.0.0");
  const std::uint32_t mask24 = ip("255.255.255.0");
  const ops::mpi::Ipv4Interface docker_0{ip("172.17.0.1"), mask16};
  int resolved = 0;  // How often the host name was resolved.
  const auto resolving_to = [&resolved](std::vector<std::uint32_t> addresses) {
    return [&resolved, addresses] {
      ++resolved;
      return addresses;
    };
  };
  const std::vector<ops::mpi::Ipv4Interface> mine = {docker_0, {ip("10.1.0.7"), mask24}};
  // Rank 0's Docker bridge has the same address as this host's: skipped; its data network's
  // address is on this host's subnet: taken, and the name is never resolved.
  CHECK(ops::mpi::choose_coordinator_address({docker_0, {ip("10.1.0.3"), mask24}}, mine,
                                             resolving_to({ip("192.168.5.3")}),
                                             false) == ip("10.1.0.3"));
  CHECK(resolved == 0);
  // No address of rank 0's on a subnet here: what its name resolves to, loopback and this
  // host's own addresses excepted.
  CHECK(ops::mpi::choose_coordinator_address(
            {docker_0, {ip("10.2.0.3"), mask24}}, mine,
            resolving_to({ip("127.0.1.1"), ip("10.1.0.7"), ip("192.168.5.3")}),
            false) == ip("192.168.5.3"));
  CHECK(resolved == 1);
  CHECK_FALSE(ops::mpi::choose_coordinator_address({docker_0}, mine,
                                                   resolving_to({ip("127.0.1.1")}), false));
  // A test on one host: rank 0's address is this host's, and allowed.
  CHECK(ops::mpi::choose_coordinator_address({{ip("10.1.0.7"), mask24}}, mine, resolving_to({}),
                                             true) == ip("10.1.0.7"));
  CHECK_FALSE(ops::mpi::choose_coordinator_address({{ip("10.1.0.7"), mask24}}, mine,
                                                   resolving_to({}), false));
}

TEST_CASE("Only the coordinator and the ranks on other hosts get a net bell", "[net_bell]") {
  // Every rank on the coordinator's host: no bell anywhere.
  CHECK(NetBell::create(MPI_COMM_WORLD, 0, /*remote=*/false) == nullptr);
  std::unique_ptr<NetBell> bell = remote_bell();
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
  std::unique_ptr<NetBell> bell = remote_bell();
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
  bell = remote_bell();  // stop_ring_waits() is for good.
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
