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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <mpi.h>

#include "test/support/mpi_test_util.h"
#include "test/support/ring_waiter.h"

namespace tutti::test {
namespace {

using ops::mpi::InterfaceAddress;
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
// on this host's subnet, which is also theirs; of `only_family` (4 or 6) where that is not 0.
std::unique_ptr<NetBell> remote_bell(int only_family = 0) {
  return NetBell::create(MPI_COMM_WORLD, 0, world_rank() != 0, /*own_addresses_allowed=*/true,
                         only_family);
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

// An address written as "10.1.0.7/24" or "fd00::2/64".
InterfaceAddress at(const char* text) {
  const std::optional<InterfaceAddress> address = InterfaceAddress::parse(text);
  REQUIRE(address);
  return *address;
}

// `address` as inet_ntop writes it, or "none".
std::string written(const std::optional<InterfaceAddress>& address) {
  if (!address) return "none";
  char text[INET6_ADDRSTRLEN] = {};
  REQUIRE(inet_ntop(address->family == 4 ? AF_INET : AF_INET6, address->bytes, text, sizeof text) !=
          nullptr);
  return text;
}

TEST_CASE("Interface addresses: parsing, subnets, loopback and link-local", "[net_bell]") {
  const InterfaceAddress v4 = at("10.1.0.7/24");
  CHECK(v4.family == 4);
  CHECK(v4.prefix_bits == 24);
  CHECK(v4.bytes[0] == 10);
  CHECK(v4.bytes[3] == 7);
  CHECK(at("10.1.0.7").prefix_bits == 32);
  const InterfaceAddress v6 = at("fd00:1::7/64");
  CHECK(v6.family == 6);
  CHECK(v6.prefix_bits == 64);
  CHECK(v6.bytes[0] == 0xfd);
  CHECK(v6.bytes[15] == 7);
  CHECK_FALSE(InterfaceAddress::parse("10.1.0.300/24"));
  CHECK_FALSE(InterfaceAddress::parse("10.1.0.7/33"));
  CHECK_FALSE(InterfaceAddress::parse("fd00::7/129"));
  CHECK_FALSE(InterfaceAddress::parse("fd00::7/6x"));
  CHECK_FALSE(InterfaceAddress::parse("tnode0"));

  CHECK(v4.on_subnet_of(at("10.1.0.200")));
  CHECK_FALSE(v4.on_subnet_of(at("10.1.1.7")));
  CHECK(at("10.1.0.7/23").on_subnet_of(at("10.1.1.7")));  // A prefix that splits a byte.
  CHECK_FALSE(at("10.1.0.7/23").on_subnet_of(at("10.1.2.7")));
  CHECK(v6.on_subnet_of(at("fd00:1::1:2")));
  CHECK_FALSE(v6.on_subnet_of(at("fd00:2::7")));
  CHECK_FALSE(v4.on_subnet_of(v6));  // Another family: never.
  CHECK(at("0.0.0.0/0").on_subnet_of(at("192.168.1.1")));

  CHECK(v4.same_address(at("10.1.0.7/16")));  // The prefix aside.
  CHECK_FALSE(v4.same_address(at("10.1.0.8")));
  CHECK(at("127.0.1.1").loopback());
  CHECK(at("::1").loopback());
  CHECK(at("::ffff:127.0.0.1").loopback());
  CHECK_FALSE(v4.loopback());
  CHECK_FALSE(v6.loopback());
  CHECK(at("fe80::fc:ff:fe00:1/64").link_local());
  CHECK(at("febf::1").link_local());
  CHECK_FALSE(at("fec0::1").link_local());
  CHECK_FALSE(v6.link_local());
}

// What the host name resolves to, in the chooser's terms.
using Resolver = std::function<std::vector<InterfaceAddress>()>;
Resolver resolving_to(std::vector<InterfaceAddress> addresses, int* calls = nullptr) {
  return [addresses, calls] {
    if (calls != nullptr) ++*calls;
    return addresses;
  };
}

TEST_CASE("A remote rank rings the coordinator's address on its subnet, never its own host",
          "[net_bell]") {
  const InterfaceAddress docker_0 = at("172.17.0.1/16");
  const std::vector<InterfaceAddress> mine = {docker_0, at("10.1.0.7/24")};
  const auto choose = [&mine](std::vector<InterfaceAddress> theirs, const Resolver& resolve,
                              bool own_allowed = false) {
    return written(ops::mpi::choose_coordinator_address(theirs, mine, resolve, own_allowed));
  };
  int resolved = 0;  // How often the host name was resolved.
  // Rank 0's Docker bridge has the same address as this host's: skipped; its data network's
  // address is on this host's subnet: taken, and the name is never resolved.
  CHECK(choose({docker_0, at("10.1.0.3/24")}, resolving_to({at("192.168.5.3")}, &resolved)) ==
        "10.1.0.3");
  CHECK(resolved == 0);
  // No address of rank 0's on a subnet here: what its name resolves to, loopback and this
  // host's own addresses excepted.
  CHECK(choose({docker_0, at("10.2.0.3/24")},
               resolving_to({at("127.0.1.1"), at("10.1.0.7"), at("192.168.5.3")}, &resolved)) ==
        "192.168.5.3");
  CHECK(resolved == 1);
  CHECK(choose({docker_0}, resolving_to({at("127.0.1.1")})) == "none");
  // A test on one host: rank 0's address is this host's, and allowed.
  CHECK(choose({at("10.1.0.7/24")}, resolving_to({}), /*own_allowed=*/true) == "10.1.0.7");
  CHECK(choose({at("10.1.0.7/24")}, resolving_to({})) == "none");
}

TEST_CASE("On an IPv6 network a remote rank rings rank 0's IPv6 address, never a link-local one",
          "[net_bell]") {
  // Both hosts have a link-local address, on the "same" fe80::/64 of every interface: skipped.
  const std::vector<InterfaceAddress> mine = {at("fe80::2/64"), at("10.9.0.7/24"),
                                              at("fd00:1::7/64")};
  const auto choose = [&mine](std::vector<InterfaceAddress> theirs, const Resolver& resolve) {
    return written(ops::mpi::choose_coordinator_address(theirs, mine, resolve, false));
  };
  CHECK(choose({at("10.2.0.3/24"), at("fe80::3/64"), at("fd00:1::3/64")},
               resolving_to({at("192.168.5.3")})) == "fd00:1::3");
  // Where an IPv4 address shares a subnet too, the first listed (rank 0 lists IPv4 first).
  CHECK(choose({at("10.9.0.3/24"), at("fd00:1::3/64")}, resolving_to({})) == "10.9.0.3");
  // Its name resolving to IPv6 addresses only: loopback, link-local and this host's skipped.
  CHECK(choose({at("fd00:2::3/64")}, resolving_to({at("::1"), at("fe80::3"), at("fd00:1::7"),
                                                   at("fd00:9::3")})) == "fd00:9::3");
  CHECK(choose({at("fe80::3/64")}, resolving_to({at("::1")})) == "none");
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
    // Only where this host has no address but loopback and link-local ones (its INFO line
    // says so).
    WARN("no net bell on this host: no address but loopback and link-local ones");
    return;
  }
  CHECK(bell->rung_here() == (world_rank() == 0));
  if (world_rank() == 0) CHECK(bell->port() != 0);
}

// Each rank but 0 rings `bell` in turn, and each ring wakes the coordinator's waiting thread,
// which counts it as over IPv6 exactly when the ringer rings an IPv6 address; then
// stop_ring_waits() ends the waits. Collective.
void check_rings(NetBell& bell) {
  const bool coordinator = world_rank() == 0;
  std::uint64_t over_ipv6 = 0;
  for (int ringer = 1; ringer < world_size(); ++ringer) {
    std::optional<Waiter> waiter;
    if (coordinator) waiter.emplace(bell);
    int family = world_rank() == ringer ? bell.ring_family() : 0;
    MPI_Bcast(&family, 1, MPI_INT, ringer, MPI_COMM_WORLD);
    if (family == 6) ++over_ipv6;
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == ringer) bell.ring();
    if (coordinator) {
      bool in_time = false;
      INFO("the ring of rank " << ringer << " over IPv" << family);
      CHECK(waiter->get(60s, &in_time));
      CHECK(in_time);
      CHECK(bell.rings_heard() == static_cast<std::uint64_t>(ringer));
      CHECK(bell.rings_heard_over_ipv6() == over_ipv6);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (coordinator) {
    std::vector<int> expected;
    for (int r = 1; r < world_size(); ++r) expected.push_back(r);
    CHECK(bell.ranks_heard() == expected);
    check_stop_ends_waits(bell);
  }
  MPI_Barrier(MPI_COMM_WORLD);
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
  check_rings(*bell);
}

TEST_CASE("Rings over IPv6 wake the coordinator's waiting thread", "[net_bell]") {
  if (world_size() == 1) return;
  std::unique_ptr<NetBell> bell = remote_bell(/*only_family=*/6);
  int everywhere = bell != nullptr ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (everywhere == 0) {
    // Only where this host has no IPv6 address but loopback and link-local ones.
    WARN("no net bell over IPv6 on this host");
    return;
  }
  if (world_rank() != 0) CHECK(bell->ring_family() == 6);
  check_rings(*bell);
}

}  // namespace
}  // namespace tutti::test
