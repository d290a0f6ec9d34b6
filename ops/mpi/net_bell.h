// SPDX-License-Identifier: Apache-2.0
// How ranks on other hosts end the coordinator's nap: a UDP datagram after a message the
// coordinator might nap through (Note [Net bell]).
//
// Note [Net bell]
// The doorbell (Note [Doorbell] in doorbell.h) is a page of shared memory, so only the ranks of
// the coordinator's host can ring it. A request from another host waited for the coordinator's
// nap to end: up to kIdleCap (src/core/idle_policy.h), 10 ms, where the coordinator is not in
// the request's process set (in every other case its own submission of the op ends the nap,
// Note [Quiet naps]). A lone 1-float allreduce on the set of ranks 1 and 2, each on a host
// without rank 0, took 6.1-7.4 ms at the median with 1.2 s between ops (2 hosts of
// scripts/netns_cluster on the 2-core AMD EPYC VM).
// So the coordinator also listens on a UDP socket, which a thread of its own (tutti-netbell)
// blocks on, and a datagram there ends the nap as a ring of the doorbell does: the same op took
// 0.74-0.94 ms (examples/BENCHMARK_LOG.md, thirtieth round).
//  - Setup, collective at init(): rank 0 binds a socket to an ephemeral port on every interface
//    (an IPv6 socket that takes IPv4 datagrams too, where the host has IPv6; else an IPv4 one)
//    and broadcasts the port, a random token, its addresses with their prefixes (IPv4, then
//    IPv6 where its socket takes IPv6) and its host name. A rank on another host sends to the
//    first of those addresses that is on a subnet of one of its own interfaces (the network MPI
//    most likely uses), else to the first address rank 0's host name resolves to; never to a
//    loopback address, an IPv6 link-local one (it names an interface of the sender's, which
//    differs from host to host), or one its own host has too (every host with Docker has
//    172.17.0.1). Where nothing qualifies the rank does not ring, and an INFO line says so.
//  - What rings. A request needs the ring only while some process set leaves the coordinator
//    out: in every other case the coordinator's own submission of the op ends its nap (Note
//    [Quiet naps] in src/core/idle_policy.h), and ringing at each training step would only wake
//    its thread once per rank on another host. A rank's last message (after shutdown() or an
//    error) rings too, so that the job stops promptly (BackgroundLoop::send_to_coordinator()).
//  - When. Nothing tells a remote rank whether the coordinator naps: there is no shared word to
//    read, and clocks cannot be compared across hosts. But the coordinator sends every response
//    list to every rank, and its nap is an eighth of its idle time: a rank that heard from it
//    within the last kQuietFor knows that the nap is at most about an eighth of that (plus the
//    network's latency), and does not ring. "Heard within" counts from the rank's last look that
//    found nothing before the message came: a message read at the end of a long nap or a long
//    op may be old (RingPolicy). Otherwise it rings, one datagram of 16 bytes: about once per op
//    where ops come far apart, and rarely in a stream of ops, where responses keep coming.
//  - A datagram may overtake the request it announces (MPI's TCP messages take their own path):
//    a ring therefore also resets the coordinator's idle clock (ControlPlane::take_net_ring()),
//    so that its naps start again from kMinNap and the request is found within microseconds of
//    its arrival, not after one more long nap.
//  - A lost datagram (a firewall, an address that does not reach rank 0) costs only the latency
//    there was before; nothing else depends on it. Quiet naps (Note [Quiet naps]) do not count
//    on the bell for that reason: a set without rank 0 still keeps the coordinator's naps at
//    kIdleCap. The token keeps stray datagrams (a port reused by a later job) from counting.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <mpi.h>

namespace tutti::ops::mpi {

// An address of an interface and the length of its subnet's prefix: IPv4 (in the first 4 of
// `bytes`) or IPv6, in network byte order. No padding: it is broadcast as bytes.
struct InterfaceAddress {
  std::uint8_t family = 0;  // 4 or 6; 0: none.
  std::uint8_t prefix_bits = 0;
  std::uint8_t reserved[2] = {};
  std::uint8_t bytes[16] = {};

  // `text` as "10.1.0.7/24" or "fd00::2/64" (no "/N": a host's own, all bits); none when it
  // is neither.
  static std::optional<InterfaceAddress> parse(std::string_view text);
  // The same address (family and bytes; the prefix aside).
  bool same_address(const InterfaceAddress& other) const;
  // `other` is on this address's subnet: the same family and the first prefix_bits bits.
  bool on_subnet_of(const InterfaceAddress& other) const;
  // 127.0.0.0/8, ::1, and IPv4 loopback mapped into IPv6.
  bool loopback() const;
  // fe80::/10, which needs the sending host's interface to mean anything.
  bool link_local() const;
};
static_assert(sizeof(InterfaceAddress) == 20);

// Which address a rank on another host sends its rings to (Note [Net bell]): the first of the
// coordinator's addresses, `theirs`, that is on the subnet of one of this host's, `mine`; else
// the first that `resolve_host` (the coordinator's host name, resolved only then) gives. Never
// a loopback or IPv6 link-local address, nor, unless `own_allowed` (tests that declare ranks of
// one host remote), an address of `mine`, which would reach this host (every host with Docker
// has 172.17.0.1). None where nothing qualifies.
std::optional<InterfaceAddress> choose_coordinator_address(
    const std::vector<InterfaceAddress>& theirs, const std::vector<InterfaceAddress>& mine,
    const std::function<std::vector<InterfaceAddress>()>& resolve_host, bool own_allowed);

// A rank on another host: whether a message it just sent the coordinator should ring
// (Note [Net bell]). The control plane tells it of its looks and of what the coordinator sent.
class RingPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // Heard from the coordinator within this, a rank does not ring: the coordinator's nap is then
  // at most about an eighth of it, shorter than kBusyCap.
  static constexpr std::chrono::microseconds kQuietFor{1000};

  // A look for messages found none.
  void looked(Clock::time_point now) { last_empty_look_ = now; }
  // A message from the coordinator was read: it was sent after the last empty look, or at most
  // a network latency before it.
  void heard() { heard_since_ = last_empty_look_; }
  bool due(Clock::time_point now) const { return now - heard_since_ >= kQuietFor; }

 private:
  // Clock's epoch (the machine's boot) until the first look: a first message rings.
  Clock::time_point last_empty_look_{};
  Clock::time_point heard_since_{};
};

class NetBell {
 public:
  // Collective over `job` (every rank of the job; `coordinator` a rank of it). `remote`: this
  // rank is not on the coordinator's host. Returns the bell on the coordinator where any remote
  // rank can ring it, on each remote rank that can, and null elsewhere (INFO lines say why a
  // rank cannot). Never fails the job: a socket error only leaves the bell out. A remote rank
  // skips the coordinator's addresses that its own host has too (they would reach its own
  // host), unless `own_addresses_allowed`: for tests that declare ranks of one host remote.
  // `only_family` 4 or 6: remote ranks ring only addresses of that family (tests of each path
  // on hosts that have both); 0, the default: either.
  static std::unique_ptr<NetBell> create(MPI_Comm job, int coordinator, bool remote,
                                         bool own_addresses_allowed = false, int only_family = 0);
  NetBell(const NetBell&) = delete;
  NetBell& operator=(const NetBell&) = delete;
  ~NetBell();  // Closes the sockets. stop_ring_waits() and the waiting thread joined first.

  // This rank is the coordinator: the one rung.
  bool rung_here() const { return rung_here_; }

  // ---- The coordinator's.
  // Blocks until a datagram with the job's token comes, true, or stop_ring_waits() is called,
  // false. One thread.
  bool wait_for_ring();
  // Makes wait_for_ring() return false, now and from now on. Any thread.
  void stop_ring_waits();
  // The UDP port it listens on (host byte order).
  std::uint16_t port() const { return port_; }
  // Rings heard so far (wait_for_ring() returned true), and the ranks they came from.
  std::uint64_t rings_heard() const { return heard_.load(); }
  std::vector<int> ranks_heard() const;
  // Of rings_heard(), those that came over IPv6 (from an IPv6 address; an IPv4 datagram on the
  // dual-stack socket comes from an IPv4-mapped one and counts as IPv4).
  std::uint64_t rings_heard_over_ipv6() const { return heard_over_ipv6_.load(); }

  // ---- A remote rank's: the family of the address it rings (4 or 6).
  int ring_family() const { return ring_family_; }
  // After it sent the coordinator a message: one datagram. Never blocks (a full socket buffer
  // drops it: the coordinator's nap then ends as without a bell).
  void ring();

 private:
  NetBell(int socket, int stop_event, bool rung_here, std::uint16_t port, std::uint64_t token,
          int rank, int job_size, int ring_family);

  int socket_;
  int stop_event_;  // The coordinator's: an eventfd that stop_ring_waits() makes readable.
  bool rung_here_;
  std::uint16_t port_;
  std::uint64_t token_;
  int rank_;
  std::atomic<bool> stopped_{false};
  std::atomic<std::uint64_t> heard_{0};
  std::atomic<std::uint64_t> heard_over_ipv6_{0};
  // Per rank, whether a ring came from it: written by the waiting thread, read after.
  std::unique_ptr<std::atomic<bool>[]> heard_from_;
  int job_size_;
  int ring_family_;  // A remote rank's; 0 on the coordinator.
};

}  // namespace tutti::ops::mpi
