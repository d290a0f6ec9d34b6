// SPDX-License-Identifier: Apache-2.0
#include "ops/mpi/doorbell.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "src/common/logging.h"

namespace tutti::ops::mpi {
namespace {

constexpr std::size_t kPageBytes = 4096;
// The two words, each on a cache line of its own: senders read `napping` on every message to
// the coordinator, and only a ring writes the futex word.
constexpr std::size_t kNappingOffset = 0;
constexpr std::size_t kRingsOffset = 64;

std::atomic_ref<std::uint32_t> word(void* page, std::size_t offset) {
  return std::atomic_ref<std::uint32_t>(
      *reinterpret_cast<std::uint32_t*>(static_cast<char*>(page) + offset));
}

// Shared futexes: no FUTEX_PRIVATE_FLAG, so that other processes mapping the page reach them.
void futex_wait(std::uint32_t* address, std::uint32_t expected) {
  syscall(SYS_futex, address, FUTEX_WAIT, expected, nullptr, nullptr, 0);
}
void futex_wake(std::uint32_t* address, int waiters) {
  syscall(SYS_futex, address, FUTEX_WAKE, waiters, nullptr, nullptr, 0);
}

// What the host's first rank tells the others.
struct Setup {
  int ok = 0;          // A page exists under `name`.
  char name[64] = {};  // For shm_open.
};

// A new page, mapped, under a name of its own written to `name` (at least 64 bytes), or null.
// The name has the pid, a count and the clock in it, and is never taken over: another job's
// (in another pid namespace, sharing /dev/shm) may be in use.
void* create_page(char* name) {
  static std::atomic<unsigned> pages{0};
  int fd = -1;
  for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
    std::snprintf(name, 64, "/tutti-doorbell-%ld-%u-%llx", static_cast<long>(getpid()),
                  pages.fetch_add(1),
                  static_cast<unsigned long long>(
                      std::chrono::steady_clock::now().time_since_epoch().count()));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    TUTTI_LOG_INFO("no doorbell for the coordinator: shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  void* page = MAP_FAILED;
  if (ftruncate(fd, kPageBytes) == 0) {
    page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int error = errno;
  close(fd);
  if (page == MAP_FAILED) {
    shm_unlink(name);
    TUTTI_LOG_INFO("no doorbell for the coordinator: mapping ", name, ": ", std::strerror(error));
    return nullptr;
  }
  std::memset(page, 0, kPageBytes);  // Both words start at 0 (as ftruncate left them).
  return page;
}

void* open_page(const char* name) {
  const int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) {
    TUTTI_LOG_INFO("cannot ring the coordinator: shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (page == MAP_FAILED) {
    TUTTI_LOG_INFO("cannot ring the coordinator: mapping ", name, ": ", std::strerror(error));
    return nullptr;
  }
  return page;
}

}  // namespace

std::unique_ptr<Doorbell> Doorbell::create(MPI_Comm host, int global_rank, int coordinator,
                                           int job_size) {
  int host_rank = 0;
  int host_size = 1;
  MPI_Comm_rank(host, &host_rank);
  MPI_Comm_size(host, &host_size);
  // The host's first rank is its lowest global rank: the coordinator, on its host.
  Setup setup;
  void* page = nullptr;
  if (host_rank == 0 && global_rank == coordinator && host_size > 1) {
    static_assert(sizeof setup.name >= 64);
    page = create_page(setup.name);
    setup.ok = page != nullptr ? 1 : 0;
  }
  MPI_Bcast(&setup, sizeof setup, MPI_BYTE, 0, host);
  if (setup.ok == 0) return nullptr;
  if (host_rank != 0) page = open_page(setup.name);
  // Once every rank has mapped it or given up, the name can go; and the coordinator learns
  // whether all of them ring.
  int mapped = page != nullptr ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &mapped, 1, MPI_INT, MPI_MIN, host);
  if (host_rank == 0) shm_unlink(setup.name);
  if (page == nullptr) return nullptr;
  const bool everyone = mapped == 1 && host_size == job_size;
  return std::unique_ptr<Doorbell>(new Doorbell(page, host_rank == 0, everyone));
}

Doorbell::Doorbell(void* page, bool owner, bool everyone)
    : page_(page), owner_(owner), everyone_(everyone) {}

Doorbell::~Doorbell() { munmap(page_, kPageBytes); }

void Doorbell::nap_begins() {
  // seq_cst: the store must be visible before the coordinator's last look for a message
  // (Note [Doorbell]).
  word(page_, kNappingOffset).store(1, std::memory_order_seq_cst);
}

void Doorbell::nap_ends() { word(page_, kNappingOffset).store(0, std::memory_order_relaxed); }

bool Doorbell::wait_for_ring() {
  std::atomic_ref<std::uint32_t> rings = word(page_, kRingsOffset);
  for (;;) {
    if (stopped_.load()) return false;
    const std::uint32_t now = rings.load(std::memory_order_acquire);
    if (now != seen_) {
      seen_ = now;
      heard_.fetch_add(1);
      return true;
    }
    // Returns at once if the word moved since the load (a ring, or stop_ring_waits()).
    futex_wait(reinterpret_cast<std::uint32_t*>(static_cast<char*>(page_) + kRingsOffset), now);
  }
}

void Doorbell::stop_ring_waits() {
  stopped_.store(true);
  // Bumped so that a waiter between its load and its sleep does not sleep.
  word(page_, kRingsOffset).fetch_add(1, std::memory_order_release);
  futex_wake(reinterpret_cast<std::uint32_t*>(static_cast<char*>(page_) + kRingsOffset), INT_MAX);
}

void Doorbell::ring() {
  // The message's delivery (the sender's stores into the coordinator's queue) before the load
  // of `napping` (Note [Doorbell]).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (word(page_, kNappingOffset).load(std::memory_order_relaxed) == 0) return;
  word(page_, kRingsOffset).fetch_add(1, std::memory_order_release);
  futex_wake(reinterpret_cast<std::uint32_t*>(static_cast<char*>(page_) + kRingsOffset), 1);
}

}  // namespace tutti::ops::mpi
