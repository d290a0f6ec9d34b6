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
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "src/common/logging.h"

namespace tutti::ops::mpi {
namespace {

constexpr int kMaxAddresses = 16;

// What the coordinator tells every rank. No padding: every byte broadcast is set.
struct BellSetup {
  std::uint64_t token = 0;
  std::int32_t ok = 0;     // A socket listens on `port`.
  std::uint32_t port = 0;  // The port as a sockaddr holds it (network byte order).
  std::int32_t ipv6 = 0;   // The socket takes IPv6 datagrams too.
  std::int32_t addresses = 0;
  InterfaceAddress interfaces[kMaxAddresses] = {};
  char host[264] = {};
};
static_assert(sizeof(BellSetup) == 8 + 4 * 4 + kMaxAddresses * sizeof(InterfaceAddress) + 264);

// What a ring sends. No padding either.
struct Datagram {
  std::uint64_t token = 0;
  std::int32_t rank = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(Datagram) == 16);

// The address bytes of `address` read as a sockaddr of `family`: 4 for AF_INET, 16 for
// AF_INET6, empty for another family. (A netmask is read with its address's family.)
std::span<const std::uint8_t> address_bytes(const sockaddr* address, int family) {
  if (family == AF_INET) {
    return {reinterpret_cast<const std::uint8_t*>(
                &reinterpret_cast<const sockaddr_in*>(address)->sin_addr),
            4};
  }
  if (family == AF_INET6) {
    return {reinterpret_cast<const std::uint8_t*>(
                &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr),
            16};
  }
  return {};
}

// `address` with the prefix of `netmask` (null: 0 bits); none for a family other than IPv4
// and IPv6.
std::optional<InterfaceAddress> from_sockaddr(const sockaddr* address, const sockaddr* netmask) {
  const std::span<const std::uint8_t> bytes = address_bytes(address, address->sa_family);
  if (bytes.empty()) return std::nullopt;
  InterfaceAddress out;
  out.family = bytes.size() == 4 ? 4 : 6;
  std::copy(bytes.begin(), bytes.end(), out.bytes);
  int bits = 0;
  if (netmask != nullptr) {
    for (std::uint8_t byte : address_bytes(netmask, address->sa_family))
      bits += std::popcount(byte);
  }
  out.prefix_bits = static_cast<std::uint8_t>(bits);
  return out;
}

// This host's interfaces that are up, with an IPv4 address or (`ipv6`) an IPv6 one, loopback
// and IPv6 link-local addresses excepted; IPv4 first.
std::vector<InterfaceAddress> host_interfaces(bool ipv6) {
  std::vector<InterfaceAddress> v4;
  std::vector<InterfaceAddress> v6;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return v4;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_netmask == nullptr) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    if (entry->ifa_addr->sa_family == AF_INET6 && !ipv6) continue;
    const std::optional<InterfaceAddress> found =
        from_sockaddr(entry->ifa_addr, entry->ifa_netmask);
    if (!found || found->loopback() || found->link_local()) continue;
    (found->family == 4 ? v4 : v6).push_back(*found);
  }
  freeifaddrs(list);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

// What `host` resolves to: IPv4 addresses, and IPv6 ones where `ipv6`, in the resolver's order.
std::vector<InterfaceAddress> resolve(const char* host, bool ipv6) {
  addrinfo hints{};
  hints.ai_family = ipv6 ? AF_UNSPEC : AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* results = nullptr;
  std::vector<InterfaceAddress> addresses;
  if (getaddrinfo(host, nullptr, &hints, &results) != 0) return addresses;
  for (addrinfo* result = results; result != nullptr; result = result->ai_next) {
    if (std::optional<InterfaceAddress> found = from_sockaddr(result->ai_addr, nullptr))
      addresses.push_back(*found);
  }
  freeaddrinfo(results);
  return addresses;
}

// A sockaddr for `address` and `port` (network byte order), and its length.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
SocketAddress to_sockaddr(const InterfaceAddress& address, std::uint32_t port) {
  SocketAddress out;
  if (address.family == 4) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&out.storage);
    v4->sin_family = AF_INET;
    std::memcpy(&v4->sin_addr, address.bytes, 4);
    v4->sin_port = static_cast<in_port_t>(port);
    out.length = sizeof(sockaddr_in);
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    v6->sin6_family = AF_INET6;
    std::memcpy(&v6->sin6_addr, address.bytes, 16);
    v6->sin6_port = static_cast<in_port_t>(port);
    out.length = sizeof(sockaddr_in6);
  }
  return out;
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

// A UDP socket of `family` bound to an ephemeral port on every interface (an IPv6 one taking
// IPv4 datagrams too), and its port; or -1 with errno set.
int bound_socket(int family, std::uint32_t* port) {
  const int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const auto fail = [fd] {
    const int error = errno;  // close() may change it.
    close(fd);
    errno = error;
    return -1;
  };
  if (family == AF_INET6) {
    const int off = 0;  // Whatever net.ipv6.bindv6only says: IPv4 rings must get through too.
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0) return fail();
  }
  // All-zero bytes are either family's wildcard address (INADDR_ANY, in6addr_any); port 0 asks
  // for an ephemeral one.
  SocketAddress address = to_sockaddr(
      InterfaceAddress{.family = family == AF_INET6 ? std::uint8_t{6} : std::uint8_t{4}},
      /*port=*/0);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0) {
    return fail();
  }
  *port = family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_port
                             : reinterpret_cast<sockaddr_in*>(&address.storage)->sin_port;
  return fd;
}

// The coordinator's socket and its port: IPv6 and IPv4 where the host has IPv6 (`*ipv6` set),
// else IPv4 only; or -1 (an INFO line says why).
int listen_socket(std::uint32_t* port, bool* ipv6) {
  int fd = bound_socket(AF_INET6, port);
  *ipv6 = fd >= 0;
  if (fd < 0) fd = bound_socket(AF_INET, port);
  if (fd < 0) {
    TUTTI_LOG_INFO("no net bell for the coordinator: a UDP socket: ", std::strerror(errno));
  }
  return fd;
}

// A remote rank's socket, connected to the coordinator's, or -1; the address's family in
// `*family`.
int ringing_socket(const BellSetup& setup, bool own_allowed, int only_family, int* family) {
  const bool ipv6 = setup.ipv6 != 0;
  const auto of_family = [only_family](std::vector<InterfaceAddress> addresses) {
    if (only_family != 0) {
      std::erase_if(addresses,
                    [only_family](const InterfaceAddress& a) { return a.family != only_family; });
    }
    return addresses;
  };
  const std::optional<InterfaceAddress> to = choose_coordinator_address(
      of_family(
          std::vector<InterfaceAddress>(setup.interfaces, setup.interfaces + setup.addresses)),
      host_interfaces(ipv6), [&] { return of_family(resolve(setup.host, ipv6)); }, own_allowed);
  if (!to) {
    TUTTI_LOG_INFO("cannot ring the coordinator over the network: no address of host ", setup.host,
                   " is on this host's subnets, and its name does not resolve to one",
                   ipv6 ? "" : " (it listens on IPv4 only)");
    return -1;
  }
  const int fd =
      socket(to->family == 4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    TUTTI_LOG_INFO("cannot ring the coordinator over the network: socket(): ",
                   std::strerror(errno));
    return -1;
  }
  const SocketAddress address = to_sockaddr(*to, setup.port);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    TUTTI_LOG_INFO("cannot ring the coordinator over the network: connect(): ",
                   std::strerror(errno));
    close(fd);
    return -1;
  }
  *family = to->family;
  return fd;
}

}  // namespace

std::optional<InterfaceAddress> InterfaceAddress::parse(std::string_view text) {
  const std::size_t slash = text.find('/');
  const std::string address(text.substr(0, slash));
  InterfaceAddress out;
  if (inet_pton(AF_INET, address.c_str(), out.bytes) == 1) {
    out.family = 4;
  } else if (inet_pton(AF_INET6, address.c_str(), out.bytes) == 1) {
    out.family = 6;
  } else {
    return std::nullopt;
  }
  const int max_bits = out.family == 4 ? 32 : 128;
  int bits = max_bits;
  if (slash != std::string_view::npos) {
    const std::string_view digits = text.substr(slash + 1);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), bits);
    if (error != std::errc{} || end != digits.data() + digits.size() || bits < 0 ||
        bits > max_bits) {
      return std::nullopt;
    }
  }
  out.prefix_bits = static_cast<std::uint8_t>(bits);
  return out;
}

bool InterfaceAddress::same_address(const InterfaceAddress& other) const {
  return family == other.family && std::memcmp(bytes, other.bytes, sizeof bytes) == 0;
}

bool InterfaceAddress::on_subnet_of(const InterfaceAddress& other) const {
  if (family != other.family) return false;
  const int whole = prefix_bits / 8;
  const int rest = prefix_bits % 8;
  if (std::memcmp(bytes, other.bytes, static_cast<std::size_t>(whole)) != 0) return false;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (bytes[whole] & mask) == (other.bytes[whole] & mask);
}

bool InterfaceAddress::loopback() const {
  static constexpr std::uint8_t kV6Loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static constexpr std::uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (family == 4) return bytes[0] == 127;
  return std::memcmp(bytes, kV6Loopback, 16) == 0 ||
         (std::memcmp(bytes, kV4Mapped, 12) == 0 && bytes[12] == 127);
}

bool InterfaceAddress::link_local() const {
  return family == 6 && bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80;
}

std::optional<InterfaceAddress> choose_coordinator_address(
    const std::vector<InterfaceAddress>& theirs, const std::vector<InterfaceAddress>& mine,
    const std::function<std::vector<InterfaceAddress>()>& resolve_host, bool own_allowed) {
  const auto usable = [&mine, own_allowed](const InterfaceAddress& address) {
    const bool own = std::any_of(mine.begin(), mine.end(), [&address](const InterfaceAddress& i) {
      return i.same_address(address);
    });
    return address.family != 0 && !address.loopback() && !address.link_local() &&
           (own_allowed || !own);
  };
  for (const InterfaceAddress& candidate : theirs) {
    if (!usable(candidate)) continue;
    for (const InterfaceAddress& own : mine) {
      if (own.on_subnet_of(candidate)) return candidate;
    }
  }
  for (const InterfaceAddress& candidate : resolve_host()) {
    if (usable(candidate)) return candidate;
  }
  return std::nullopt;
}

std::unique_ptr<NetBell> NetBell::create(MPI_Comm job, int coordinator, bool remote,
                                         bool own_addresses_allowed, int only_family) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(job, &rank);
  MPI_Comm_size(job, &size);
  int remotes = remote ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &remotes, 1, MPI_INT, MPI_SUM, job);
  if (remotes == 0) return nullptr;  // One host: the doorbell's.

  BellSetup setup;
  int fd = -1;
  int stop_event = -1;
  if (rank == coordinator) {
    bool ipv6 = false;
    fd = listen_socket(&setup.port, &ipv6);
    setup.ipv6 = ipv6 ? 1 : 0;
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
      for (const InterfaceAddress& own : host_interfaces(setup.ipv6 != 0)) {
        if (setup.addresses == kMaxAddresses) break;
        setup.interfaces[setup.addresses++] = own;
      }
      if (gethostname(setup.host, sizeof setup.host - 1) != 0) setup.host[0] = '\0';
    }
  }
  MPI_Bcast(&setup, sizeof setup, MPI_BYTE, coordinator, job);
  if (setup.ok == 0) return nullptr;
  int family = 0;
  if (remote) fd = ringing_socket(setup, own_addresses_allowed, only_family, &family);
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
                                              setup.token, rank, size, family));
}

NetBell::NetBell(int socket, int stop_event, bool rung_here, std::uint16_t port,
                 std::uint64_t token, int rank, int job_size, int ring_family)
    : socket_(socket),
      stop_event_(stop_event),
      rung_here_(rung_here),
      port_(port),
      token_(token),
      rank_(rank),
      heard_from_(rung_here ? new std::atomic<bool>[job_size]() : nullptr),
      job_size_(job_size),
      ring_family_(ring_family) {}

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
    sockaddr_storage sender{};
    socklen_t sender_length = sizeof sender;
    const ssize_t got = recvfrom(socket_, bytes, sizeof bytes, MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr*>(&sender), &sender_length);
    if (got != static_cast<ssize_t>(sizeof(Datagram))) continue;
    Datagram ring;
    std::memcpy(&ring, bytes, sizeof ring);
    if (ring.token != token_ || ring.rank < 0 || ring.rank >= job_size_) continue;
    heard_from_[ring.rank].store(true, std::memory_order_relaxed);
    if (sender.ss_family == AF_INET6 &&
        !IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<const sockaddr_in6*>(&sender)->sin6_addr)) {
      heard_over_ipv6_.fetch_add(1);
    }
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
