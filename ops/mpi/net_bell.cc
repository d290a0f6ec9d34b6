// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/net_bell.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <string>

#include "src/common/logging.h"

namespace tutti::ops::mpi {
namespace {

constexpr int kMaxAddresses = 16;

// What the coordinator tells every rank. No padding: every byte broadcast is set.
struct Setup {
  std::uint64_t token = 0;
  std::int32_t ok = 0;     // A socket listens on `port`.
  std::uint32_t port = 0;  // sin_port as it is (network byte order).
  std::int32_t addresses = 0;
  Ipv4Interface interfaces[kMaxAddresses] = {};
  char host[260] = {};
};
static_assert(sizeof(Setup) == 8 + 3 * 4 + kMaxAddresses * 8 + 260);

// What a ring sends. No padding either.
struct Datagram {
  std::uint64_t token = 0;
  std::int32_t rank = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(Datagram) == 16);

// This host's IPv4 interfaces that are up, loopback excepted.
std::vector<Ipv4Interface> ipv4_interfaces() {
  std::vector<Ipv4Interface> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_netmask == nullptr) continue;
    if (entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    found.push_back(Ipv4Interface{
        .address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr.s_addr,
        .netmask = reinterpret_cast<sockaddr_in*>(entry->ifa_netmask)->sin_addr.s_addr});
  }
  freeifaddrs(list);
  return found;
}

// What `host` resolves to (IPv4).
std::vector<std::uint32_t> resolve(const char* host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* results = nullptr;
  std::vector<std::uint32_t> addresses;
  if (getaddrinfo(host, nullptr, &hints, &results) != 0) return addresses;
  for (addrinfo* result = results; result != nullptr; result = result->ai_next) {
    addresses.push_back(reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr.s_addr);
  }
  freeaddrinfo(results);
  return addresses;
}

// Keeps stray datagrams out, not attackers: the clock stands in where no random device works.
std::uint64_t random_token() {
  try {
    std::random_device device;
    return device() | (std::uint64_t{device()} << 32);
  } catch (const std::exception&) {
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(getpid()) << 32);
  }
}

// The coordinator's socket, bound to an ephemeral port on every interface, and its port; or
// -1 (an INFO line says why).
int listen_socket(std::uint32_t* port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    TUTTI_LOG_INFO("no net bell for the coordinator: socket(): ", std::strerror(errno));
    return -1;
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    TUTTI_LOG_INFO("no net bell for the coordinator: binding a UDP socket: ", std::strerror(errno));
    close(fd);
    return -1;
  }
  *port = address.sin_port;
  return fd;
}

// A remote rank's socket, connected to the coordinator's, or -1.
int ringing_socket(const Setup& setup, bool own_allowed) {
  const std::optional<std::uint32_t> to = choose_coordinator_address(
      std::vector<Ipv4Interface>(setup.interfaces, setup.interfaces + setup.addresses),
      ipv4_interfaces(), [&setup] { return resolve(setup.host); }, own_allowed);
  if (!to) {
    TUTTI_LOG_INFO("cannot ring the coordinator over the network: no IPv4 address of host ",
                   setup.host, " is on this host's subnets, and its name does not resolve to one");
    return -1;
  }
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    TUTTI_LOG_INFO("cannot ring the coordinator over the network: socket(): ",
                   std::strerror(errno));
    return -1;
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = *to;
  address.sin_port = static_cast<in_port_t>(setup.port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    TUTTI_LOG_INFO("cannot ring the coordinator over the network: connect(): ",
                   std::strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::optional<std::uint32_t> choose_coordinator_address(
    const std::vector<Ipv4Interface>& theirs, const std::vector<Ipv4Interface>& mine,
    const std::function<std::vector<std::uint32_t>()>& resolve_host, bool own_allowed) {
  const auto usable = [&mine, own_allowed](std::uint32_t address) {
    const bool loopback = (ntohl(address) >> 24) == 127;
    const bool own = std::any_of(mine.begin(), mine.end(), [address](const Ipv4Interface& i) {
      return i.address == address;
    });
    return !loopback && (own_allowed || !own);
  };
  for (const Ipv4Interface& candidate : theirs) {
    if (!usable(candidate.address)) continue;
    for (const Ipv4Interface& own : mine) {
      if ((own.address & own.netmask) == (candidate.address & own.netmask)) {
        return candidate.address;
      }
    }
  }
  for (std::uint32_t candidate : resolve_host()) {
    if (usable(candidate)) return candidate;
  }
  return std::nullopt;
}

std::unique_ptr<NetBell> NetBell::create(MPI_Comm job, int coordinator, bool remote,
                                         bool own_addresses_allowed) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(job, &rank);
  MPI_Comm_size(job, &size);
  int remotes = remote ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &remotes, 1, MPI_INT, MPI_SUM, job);
  if (remotes == 0) return nullptr;  // One host: the doorbell's.

  Setup setup;
  int fd = -1;
  int stop_event = -1;
  if (rank == coordinator) {
    fd = listen_socket(&setup.port);
    if (fd >= 0) {
      stop_event = eventfd(0, EFD_CLOEXEC);
      if (stop_event < 0) {
        TUTTI_LOG_INFO("no net bell for the coordinator: eventfd(): ", std::strerror(errno));
        close(fd);
        fd = -1;
      }
    }
    if (fd >= 0) {
      setup.ok = 1;
      setup.token = random_token();
      for (const Ipv4Interface& own : ipv4_interfaces()) {
        if (setup.addresses == kMaxAddresses) break;
        setup.interfaces[setup.addresses++] = own;
      }
      if (gethostname(setup.host, sizeof setup.host - 1) != 0) setup.host[0] = '\0';
    }
  }
  MPI_Bcast(&setup, sizeof setup, MPI_BYTE, coordinator, job);
  if (setup.ok == 0) return nullptr;
  if (remote) fd = ringing_socket(setup, own_addresses_allowed);
  int ringers = remote && fd >= 0 ? 1 : 0;
  MPI_Reduce(rank == coordinator ? MPI_IN_PLACE : &ringers, &ringers, 1, MPI_INT, MPI_SUM,
             coordinator, job);
  if (rank == coordinator && ringers == 0) {
    TUTTI_LOG_INFO("no net bell for the coordinator: no rank on another host can reach it");
    close(fd);
    close(stop_event);
    return nullptr;
  }
  if (fd < 0) return nullptr;
  return std::unique_ptr<NetBell>(new NetBell(fd, stop_event, rank == coordinator,
                                              ntohs(static_cast<in_port_t>(setup.port)),
                                              setup.token, rank, size));
}

NetBell::NetBell(int socket, int stop_event, bool rung_here, std::uint16_t port,
                 std::uint64_t token, int rank, int job_size)
    : socket_(socket),
      stop_event_(stop_event),
      rung_here_(rung_here),
      port_(port),
      token_(token),
      rank_(rank),
      heard_from_(rung_here ? new std::atomic<bool>[job_size]() : nullptr),
      job_size_(job_size) {}

NetBell::~NetBell() {
  close(socket_);
  if (stop_event_ >= 0) close(stop_event_);
}

bool NetBell::wait_for_ring() {
  pollfd watched[2] = {{.fd = socket_, .events = POLLIN, .revents = 0},
                       {.fd = stop_event_, .events = POLLIN, .revents = 0}};
  for (;;) {
    if (stopped_.load()) return false;
    if (poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      TUTTI_LOG_INFO("the net bell stops listening: poll(): ", std::strerror(errno));
      return false;
    }
    if (watched[1].revents != 0) return false;  // stop_ring_waits().
    // One byte more than a ring: a longer datagram is not one.
    char bytes[sizeof(Datagram) + 1];
    const ssize_t got = recv(socket_, bytes, sizeof bytes, MSG_DONTWAIT);
    if (got != static_cast<ssize_t>(sizeof(Datagram))) continue;
    Datagram ring;
    std::memcpy(&ring, bytes, sizeof ring);
    if (ring.token != token_ || ring.rank < 0 || ring.rank >= job_size_) continue;
    heard_from_[ring.rank].store(true, std::memory_order_relaxed);
    heard_.fetch_add(1);
    return true;
  }
}

void NetBell::stop_ring_waits() {
  stopped_.store(true);
  const std::uint64_t one = 1;
  static_cast<void>(write(stop_event_, &one, sizeof one));
}

std::vector<int> NetBell::ranks_heard() const {
  std::vector<int> ranks;
  for (int r = 0; r < job_size_ && heard_from_ != nullptr; ++r) {
    if (heard_from_[r].load(std::memory_order_relaxed)) ranks.push_back(r);
  }
  return ranks;
}

void NetBell::ring() {
  const Datagram ring{.token = token_, .rank = rank_};
  // Errors are ignored: ECONNREFUSED once the coordinator's socket is gone, EAGAIN with a full
  // buffer. Either way its nap ends as it would without a bell.
  static_cast<void>(send(socket_, &ring, sizeof ring, MSG_DONTWAIT | MSG_NOSIGNAL));
}

}  // namespace tutti::ops::mpi
