// SPDX-License-Identifier: Apache-2.0
// How the ranks on the coordinator's host end its communication thread's nap when they send it a
// message: a page of shared memory with a futex in it (Note [Doorbell]).
//
// Note [Doorbell]
// The coordinator (global rank 0) negotiates the ops of every process set, those it is not a
// member of too. With no op of its own in flight, its communication thread naps between polls
// for up to 10 ms (kIdleCap in src/core/idle_policy.h), and MPI has no way to wake it: a request
// sent to it waited for the nap to end. A one-float allreduce on the set of ranks 1 and 2, 3
// ranks on a 2-core AMD EPYC VM, one op every 50 ms: 3.3-4.9 ms at the median, against 0.3-0.4
// ms on the global set, where rank 0's own submission wakes it; 0.38-0.42 ms with the doorbell
// (examples/set_latency_benchmark; README, Process sets).
// So the ranks of the coordinator's host share one page with it: a `napping` word the coordinator
// sets for the length of a long nap, and a futex word that a sender, having sent the coordinator
// a message, bumps and wakes (FUTEX_WAKE without the private flag, which works across processes)
// when it finds `napping` set. A thread of the coordinator's that sleeps on the futex
// (wait_for_ring()) then ends the nap.
// No wake-up is lost where MPI delivers at once (a small message over shared memory is in the
// receiver's queue when MPI_Isend returns): the coordinator sets `napping` and then looks for a
// message once more before it naps; a sender sends, fences, then reads `napping`. Each side's
// store comes before its load, so at least one of them sees the other's. A message MPI hands
// over later is found when the nap ends, as without a doorbell. Ranks on other hosts cannot ring
// it: they send a datagram instead (Note [Net bell] in net_bell.h).
// Where every rank of the job rings (one host, and each mapped the page), or the coordinator is
// in every process set, its idle naps may be longer still: Note [Quiet naps] in
// src/core/idle_policy.h.
// The page is POSIX shared memory (shm_open), unlinked as soon as every rank of the host has
// mapped it, so nothing outlives the job. A rank that cannot map it does not ring, and a host
// whose coordinator cannot create it has no doorbell: its naps end as before.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <mpi.h>

namespace tutti::ops::mpi {

class Doorbell {
 public:
  // Collective over `host` (the ranks sharing this host, MPI_COMM_TYPE_SHARED, ordered by
  // global rank) of a job of `job_size` ranks: the doorbell of `coordinator`, a global rank,
  // where it is on this host and the host has other ranks; else null on every rank of the
  // host. Null also where the page cannot be shared (a log line at INFO says why).
  static std::unique_ptr<Doorbell> create(MPI_Comm host, int global_rank, int coordinator,
                                          int job_size);
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;
  ~Doorbell();  // Local: unmaps the page. stop_ring_waits() and the waiting thread joined first.

  // This rank is the coordinator: the one rung.
  bool rung_here() const { return owner_; }
  // This rank is the coordinator and every other rank of the job rings it: they all share its
  // host, and each mapped the page.
  bool every_rank_rings() const { return owner_ && everyone_; }

  // ---- The coordinator's.
  // A nap that rings should end begins (from now on senders ring), and ends.
  void nap_begins();
  void nap_ends();
  // Blocks until a sender rings, true, or stop_ring_waits() is called, false. One thread.
  bool wait_for_ring();
  // Makes wait_for_ring() return false, now and from now on. Any thread.
  void stop_ring_waits();
  // Rings heard so far (wait_for_ring() returned true): what tells a test the doorbell worked.
  std::uint64_t rings_heard() const { return heard_.load(); }

  // ---- Every other rank's, after it sent the coordinator a message: wakes the thread in
  // wait_for_ring() if the coordinator naps. A fence and a load when it does not.
  void ring();

 private:
  Doorbell(void* page, bool owner, bool everyone);

  void* page_;
  bool owner_;
  bool everyone_;  // Every rank of the job shares the page.
  std::atomic<bool> stopped_{false};
  std::uint32_t seen_ = 0;  // The futex word's value wait_for_ring() last returned on.
  std::atomic<std::uint64_t> heard_{0};
};

}  // namespace tutti::ops::mpi
