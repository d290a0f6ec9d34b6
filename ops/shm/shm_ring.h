// SPDX-License-Identifier: Apache-2.0
// The shared memory the intra-host collectives move data through: one MPI-3 shared window
// over a communicator whose ranks share a host, holding per rank three progress counters, a few
// words of board (what the backend shares besides data) and a ring of slots that every peer can
// read. Communication thread only.
//
// Note [Shared-memory ring]
// Collectives move data in chunks of at most slot_bytes(). Chunk number `c` counts the chunks
// of the backend's whole life; every rank runs the same collectives with the same sizes in the
// same order (core's guarantee), so `c` names the same chunk on every rank. Chunk c lives in
// slot c % slots() of each rank. Per chunk a rank
//   1. waits until every rank has consumed chunk c - slots(): its slot is free everywhere;
//   2. writes its part into its own slot (less the share it reduces from its inputs: Note
//      [Own share read in place] in shm_backend.cc) and publishes Staged = c + 1;
//   3. waits for the ranks it reads (Staged >= c + 1) and works on their slots: a reduction
//      writes its share back into its own slot and publishes Reduced = c + 1, and the readers of
//      that share wait for it;
//   4. copies out what it needs and publishes Consumed = c + 1.
// Counters only grow and each sits on a cache line of its own. A rank publishes with a release
// store after its writes and reads a peer's counter with an acquire load before reading that
// peer's slot, so the data is visible when the counter is. MPI owns the segment: it is freed
// with the window (collectively, when the backend is destroyed), and a crashed job leaves
// nothing behind in /dev/shm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <mpi.h>

#include "src/common/status.h"

namespace tutti::ops::shm {

// Bytes of a cache line: what the ring and the backend align shares to, so that no two ranks
// write one line.
inline constexpr std::size_t kCacheLine = 64;

class ShmRing {
 public:
  enum class Counter : int { Staged = 0, Reduced = 1, Consumed = 2 };
  // Words of each rank's board.
  static constexpr std::size_t kBoardWords = 32;

  // Collective over `comm`, whose ranks must share a host (MPI_COMM_TYPE_SHARED); `comm` must
  // outlive the ring. slot_bytes is rounded up to a multiple of 64. `oversubscribed`: the host
  // runs more ranks than it has CPUs (BackendOptions::host_oversubscribed).
  static Result<std::unique_ptr<ShmRing>> create(MPI_Comm comm, std::size_t slot_bytes, int slots,
                                                 bool oversubscribed);
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;
  ~ShmRing();  // Collective over the communicator (MPI_Win_free), unless abandoned.
  // Makes the destructor local: the window is left to MPI_Finalize (see Backend::abandon).
  void abandon() { window_ = MPI_WIN_NULL; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t slot_bytes() const { return slot_bytes_; }

  // The next chunk number; every collective takes its chunks from here, one at a time.
  std::uint64_t take_chunk() { return next_chunk_++; }
  // Chunks taken so far.
  std::uint64_t chunks_taken() const { return next_chunk_; }
  // `rank`'s slot of chunk `chunk`.
  std::byte* slot(int rank, std::uint64_t chunk) const;

  // Step 1 of the Note: returns once `chunk`'s slot is free on every rank.
  void wait_slot_free(std::uint64_t chunk) const;
  // This rank has passed `counter` for `chunk`.
  void publish(Counter counter, std::uint64_t chunk);
  // Returns once `rank` has passed `counter` for `chunk`.
  void wait(int rank, Counter counter, std::uint64_t chunk) const;
  // Returns once every rank has.
  void wait_all(Counter counter, std::uint64_t chunk) const;

  // `rank`'s board: kBoardWords words, zero at creation, on cache lines of their own, that the
  // ring itself never touches. Its owner writes them and any rank may read them, through
  // std::atomic_ref; what orders them is the backend's (Note [Streaming stores] in staging.h).
  std::uint64_t* board(int rank) const;

 private:
  ShmRing() = default;
  std::uint64_t* counter(int rank, Counter counter) const;

  MPI_Win window_ = MPI_WIN_NULL;
  MPI_Comm comm_ = MPI_COMM_NULL;  // Probed while waiting, to keep MPI progressing.
  int rank_ = 0;
  int size_ = 1;
  // More ranks on this host than CPUs: a waiting rank yields sooner (see wait_until()).
  bool oversubscribed_ = true;
  int slots_ = 1;
  std::size_t slot_bytes_ = 0;
  std::vector<std::byte*> regions_;  // Every rank's region, as mapped in this process.
  std::uint64_t next_chunk_ = 0;
};

}  // namespace tutti::ops::shm
