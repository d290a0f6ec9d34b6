// SPDX-License-Identifier: Apache-2.0
#include "ops/shm/shm_ring.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "ops/mpi/mpi_error.h"
#include "src/common/mutex.h"

namespace tutti::ops::shm {
namespace {

constexpr int kCounters = 3;
// The counters' cache lines, the board's, then the slots.
constexpr std::size_t kCounterBytes = kCounters * kCacheLine;
constexpr std::size_t kBoardBytes = ShmRing::kBoardWords * sizeof(std::uint64_t);
static_assert(kBoardBytes % kCacheLine == 0);
constexpr std::size_t kHeaderBytes = kCounterBytes + kBoardBytes;
// The smallest page size Linux uses on the CPUs Tutti runs on: touching a byte every this many
// faults in every page (Note [Faulting the ring in]).
constexpr std::size_t kPageBytes = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Peers normally arrive within microseconds (they run the same collective), so spin first;
// past that a peer may be descheduled, and yielding the core lets it run, or lets this rank's
// own compute thread run (an overlapped backward pass); past 20 ms the peer is doing something
// else entirely, and sleeping keeps a waiting rank from burning a core.
// How long to spin depends on who may need this core:
// - More ranks than CPUs on the host (`oversubscribed`, as in the tests): the late peer may be
//   waiting for this very core, so spin only 200 pauses (some 10-30 us: a pause is 40-140
//   cycles depending on the core). With 4 ranks on 2 cores, 2000 pauses and 1 ms of yielding
//   made a 1-float allreduce take ~290 us; these ~40 us.
// - Otherwise each rank has a CPU of its own, and a yield only hands it to whatever else runs
//   there, for a whole time slice when that is a busy process: on a 2-core AMD VM with one
//   busy process on one rank's CPU, P1 over shared memory took 52-112 ms with the 200 pauses
//   alone and 21-27 ms with this spin (raw MPI, which busy-polls, 49-64 ms; all 10-15 ms
//   idle). So spin up to kOwnCpuSpin before yielding.
// A peer may also not have started the collective yet because it is still waiting for the
// response list this rank sent it: MPI delivers that message only while this rank makes MPI
// progress (MPICH always, Open MPI for large lists). So past the pauses every poll also drives
// MPI's progress engine, through a probe on `comm` (which matches nothing Tutti leaves there).
constexpr auto kOwnCpuSpin = std::chrono::microseconds(50);

template <class Done>
void wait_until(Done done, MPI_Comm comm, bool oversubscribed) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return;
    detail::cpu_relax();
  }
  const auto start = std::chrono::steady_clock::now();
  if (!oversubscribed) {
    while (!done() && std::chrono::steady_clock::now() - start < kOwnCpuSpin) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
      for (int i = 0; i < 50 && !done(); ++i) detail::cpu_relax();
    }
  }
  while (!done()) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(20)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace

Result<std::unique_ptr<ShmRing>> ShmRing::create(MPI_Comm comm, std::size_t slot_bytes, int slots,
                                                 bool oversubscribed) {
  auto ring = std::unique_ptr<ShmRing>(new ShmRing());
  MPI_Comm_rank(comm, &ring->rank_);
  MPI_Comm_size(comm, &ring->size_);
  ring->slots_ = slots;
  ring->comm_ = comm;
  ring->oversubscribed_ = oversubscribed;
  ring->slot_bytes_ = round_up(slot_bytes, kCacheLine);
  // A line more than needed: MPI aligns regions less than a cache line, so each starts at its
  // first line boundary. Segments are mapped page-aligned, so that boundary is the same memory
  // in every process.
  const std::size_t region =
      kHeaderBytes + ring->slot_bytes_ * static_cast<std::size_t>(slots) + kCacheLine;
  std::byte* mine = nullptr;
  // Noncontiguous: each rank's region may start on its own page (near its own NUMA node).
  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  const int rc =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(region), 1, info, comm, &mine, &ring->window_);
  MPI_Info_free(&info);
  TUTTI_RETURN_IF_ERROR(mpi::mpi_status(rc, "MPI_Win_allocate_shared"));
  ring->regions_.resize(static_cast<std::size_t>(ring->size_));
  for (int r = 0; r < ring->size_; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* base = nullptr;
    TUTTI_MPI_RETURN_IF_ERROR(MPI_Win_shared_query(ring->window_, r, &bytes, &unit, &base));
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    ring->regions_[static_cast<std::size_t>(r)] =
        static_cast<std::byte*>(base) + (round_up(address, kCacheLine) - address);
  }
  static_cast<void>(mine);
  // Counters and board start at zero, and nobody may read them before they are.
  for (int c = 0; c < kCounters; ++c) {
    std::atomic_ref<std::uint64_t>(*ring->counter(ring->rank_, static_cast<Counter>(c)))
        .store(0, std::memory_order_relaxed);
  }
  for (std::size_t w = 0; w < kBoardWords; ++w) {
    std::atomic_ref<std::uint64_t>(ring->board(ring->rank_)[w]).store(0, std::memory_order_relaxed);
  }
  // Note [Faulting the ring in]: each rank writes its own slots (so that its pages are
  // placed by their writer, near its NUMA node), then maps every peer's by reading a byte a
  // page, then all wait for all, so that no collective reads or writes a slot meanwhile.
  // Otherwise the first collectives pay a page fault per page and process (on a 2-core AMD
  // EPYC VM the first 1 MB allreduce took 0.8-1.0 ns a byte against 0.12 after), and the
  // staging choice (staging.h), which measures them, took that for the cost of ordinary
  // stores: P1's first four steps ran with the wrong stores at 14-18 ms against 9.
  const std::size_t slots_bytes = ring->slot_bytes_ * static_cast<std::size_t>(slots);
  std::memset(ring->slot(ring->rank_, 0), 0, slots_bytes);
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Barrier(comm));
  for (int r = 0; r < ring->size_; ++r) {
    if (r == ring->rank_) continue;
    const std::byte* first = ring->slot(r, 0);
    for (std::size_t at = 0; at < slots_bytes; at += kPageBytes) {
      static_cast<void>(*static_cast<const volatile std::byte*>(first + at));
    }
  }
  TUTTI_MPI_RETURN_IF_ERROR(MPI_Barrier(comm));
  return ring;
}

ShmRing::~ShmRing() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (window_ != MPI_WIN_NULL && !finalized) MPI_Win_free(&window_);
}

std::byte* ShmRing::slot(int rank, std::uint64_t chunk) const {
  return regions_[static_cast<std::size_t>(rank)] + kHeaderBytes +
         slot_bytes_ * static_cast<std::size_t>(chunk % static_cast<std::uint64_t>(slots_));
}

std::uint64_t* ShmRing::board(int rank) const {
  return reinterpret_cast<std::uint64_t*>(regions_[static_cast<std::size_t>(rank)] + kCounterBytes);
}

std::uint64_t* ShmRing::counter(int rank, Counter which) const {
  return reinterpret_cast<std::uint64_t*>(regions_[static_cast<std::size_t>(rank)] +
                                          static_cast<std::size_t>(which) * kCacheLine);
}

void ShmRing::wait_slot_free(std::uint64_t chunk) const {
  const auto slots = static_cast<std::uint64_t>(slots_);
  if (chunk < slots) return;
  wait_all(Counter::Consumed, chunk - slots);
}

void ShmRing::publish(Counter which, std::uint64_t chunk) {
  std::atomic_ref<std::uint64_t>(*counter(rank_, which))
      .store(chunk + 1, std::memory_order_release);
}

void ShmRing::wait(int rank, Counter which, std::uint64_t chunk) const {
  std::atomic_ref<std::uint64_t> value(*counter(rank, which));
  wait_until([&] { return value.load(std::memory_order_acquire) > chunk; }, comm_, oversubscribed_);
}

void ShmRing::wait_all(Counter which, std::uint64_t chunk) const {
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) wait(r, which, chunk);
  }
}

}  // namespace tutti::ops::shm
