// SPDX-License-Identifier: Apache-2.0
// How a rank writes the data it stages in its ring slot for the peers to read: with ordinary
// (cached) stores, or with streaming stores that bypass its cache, chosen per collective from
// what the collectives take (Note [Streaming stores]). Communication thread only.
//
// Note [Streaming stores]
// A peer reads a staged chunk from wherever its lines are. Written with ordinary stores they sit
// dirty in the writer's cache, and each line moves cache to cache. Where the two CPUs share a
// last-level cache that is the fastest path there is. Where they do not (the two vCPUs of a VM on
// different dies or sockets of the host, a placement the host may change at any time) every
// such transfer crosses the interconnect. On a 2-core AMD EPYC VM a cache line's round trip
// between the two ranks took 81-93 ns in some periods and 302-571 ns in others, and a 2-rank
// allreduce of ResNet-50's gradients (allreduce_benchmark's P1) 13 ms in the first and 50 ms
// in the second (medians), against raw MPI's 19-24 ms either way (raw MPI reads cold buffers
// from memory). Streaming stores write the chunk to memory instead, so the peer reads it from
// memory: P1 took 15 ms in the slow placement but 20 ms in the fast one (allreduce_benchmark
// --stores prints them with the round trip; README, "How it works"). A reduction that streams
// writes each rank's reduced share that way too (Note [Own share read in place] in
// shm_backend.cc). Neither wins everywhere and
// the placement moves under a running job, so each collective family keeps the measured cost per
// byte of each kind for its collectives of at least kMeasuredBytes and uses the cheaper one. The
// other takes over only when it costs less than 0.8 times as much: collectives of different make-up
// and the wait for the last rank to arrive scatter the samples. Now and then a collective tries
// the other kind again (Note [How often the other kind is tried]), so a placement that makes the
// kind not in use the cheaper one is noticed at the next try, within 128 measured collectives;
// one that makes the kind in use costlier is noticed at once (two collectives late: see below). The
// first measured collective of a family is a warm-up and is not learned from: it pays what only a
// first use pays (cold caches and code, a peer arriving late from its own first collective), and on
// a 2-core AMD EPYC VM it took 0.30 ns a byte with ordinary stores against 0.11-0.12 for the next
// ones (0.8-1.0 before the ring's pages were faulted in at its creation, Note [Faulting the ring
// in] in shm_ring.cc), enough to make streaming stores look cheaper and, measured twice as cheap,
// to keep them for a long period: P1's first four steps ran at 14-18 ms against 9. Smaller
// collectives are latency-bound and stage with ordinary stores. Every rank of the host makes the
// same choice, from the same samples: host rank 0's. What a kind costs depends on what every rank
// does (each reads what the others staged), and ranks that chose from their own samples came apart:
// with 4 ranks on a 2-core AMD EPYC VM one rank kept ordinary stores while three streamed, and,
// measuring its ordinary stores while its peers streamed, found them dear and stayed; another
// switched to streaming on a few slow collectives of its own. P1 took 9-21 % more than with
// streaming stores everywhere. So host rank 0 writes each measured collective's cost on its board
// (ShmRing::board), tagged with the collective's number, and every rank decides collective n from
// the costs of collectives up to n - 2 (kLag). Those are on the board by then where the family's
// collectives read every rank's slot (the reductions, allgather): a rank starting n has finished n
// - 1, in which it read a slot rank 0 filled after recording n - 2. Where a family does not order
// it so (a gather's other ranks read no slot, a broadcast's only the root's), a rank that finds the
// cost not yet on the board uses its own, and the ranks may choose apart: in P11's gather to rank 0
// at 4 ranks on a 2-core AMD EPYC VM, the other ranks took 60-100 of 296 costs from their own
// measurements, and rank 0 streamed 45 of the collectives, the others 28, 29 and 256. Agreement
// there, each rank deciding from rank 0's costs slots + 2 collectives back (where the ring's flow
// control guarantees them), made that gather slower, 16 ms at the median against 14: only its other
// ranks stage, each for the root alone, and they need not be served best by one kind
// (examples/BENCHMARK_LOG.md, twenty-seventh round). TUTTI_SHM_STREAMING_STORES
// fixes the choice (0: ordinary, 1: streaming).
//
// Note [How often the other kind is tried]
// A try costs what the kind not in use costs more than the one in use, and it used to come every
// 32nd measured collective (every 128th where that kind had cost twice as much or more): a tax on
// every byte while the placement stays. On a 2-core AMD EPYC VM of family 25 model 17 streaming
// stores cost 1.6 times as much as ordinary ones with the vCPUs close (0.22-0.23 ns a byte
// against 0.14), so 1 collective in 32 at that cost made 1.8-2.0 % more time; with the vCPUs
// apart ordinary stores cost 2.3-3.1 times as much as streaming ones (0.59-0.62 against
// 0.20-0.25), and 1 in 128 at that cost 1.1-1.6 %. Tries are not all tax, though: a switch may
// have been a mistake (a collective whose rank was descheduled moves the average of the kind in
// use by a quarter of its excess), and only a try of the kind left can undo it. Two first
// builds waited as long as keeps the tries within 0.25 % of the time at the measured gap, up to
// 512 and up to 128 collectives, counted from the last try or switch: with 4 ranks on the 2
// cores, where samples scatter most, `auto` then took 1.070 and 1.059 of the better kind's time
// at the median (18 rounds each of `allreduce_benchmark --stores`), against 0.989 and 1.015
// before in the same sessions. So the wait now backs off: after a switch it is kMinExplorePeriod
// (32) measured collectives, and each try doubles it, up to kMaxExplorePeriod (128, the old
// longest) or, if sooner, what keeps a try's extra cost within kExploreBudget (0.25 %) of the
// collectives since the last one: (cost of the other kind / cost of the kind in use - 1) /
// kExploreBudget, at least 32. A mistaken switch is tried back 32 collectives later, as before; a
// settled choice with the vCPUs close tries the other kind every 128th collective instead of every
// 32nd (some 0.5 % of the time instead of 1.9); and no wait is longer than the old longest, 128
// collectives. P1 (ResNet-50's 102 MB of gradients in 1 MiB fusion buffers) makes some
// 33 measured collectives a step. Every rank waits alike, since every rank decides from the same
// costs (host rank 0's; a rooted family's ranks that use their own may try at other times, as they
// may choose apart).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "ops/transport.h"

namespace tutti::ops::shm {

// Copies `bytes` from `from` to `to` (no overlap) with streaming stores where the CPU has them
// (x86-64; elsewhere a plain memcpy), then orders them before any later store: a counter
// published after it is seen after the data.
void stream_copy(void* to, const void* from, std::size_t bytes);

// One collective family's choice of stores (Note [Streaming stores]).
class StagingChoice {
 public:
  // Collectives that move fewer bytes in total are not measured and stage with ordinary stores.
  static constexpr std::size_t kMeasuredBytes = 512 * 1024;
  // The kind not in use is measured again after a wait of measured collectives that starts at
  // kMinExplorePeriod after a switch and doubles with each try, up to kMaxExplorePeriod or the
  // number that keeps its tries' extra cost, at the gap last measured, within kExploreBudget of
  // the collectives between them (Note [How often the other kind is tried]).
  static constexpr double kExploreBudget = 1.0 / 400;
  static constexpr std::uint64_t kMinExplorePeriod = 32;
  static constexpr std::uint64_t kMaxExplorePeriod = 128;
  // Collective n is decided from the costs of collectives up to n - kLag.
  static constexpr std::uint64_t kLag = 2;
  // Words of board a family takes: the costs of its last kBoardWords measured collectives.
  static constexpr std::size_t kBoardWords = 4;
  static_assert(kBoardWords > kLag);

  explicit StagingChoice(ShmStores mode = ShmStores::Auto) : mode_(mode) {}

  // Takes the costs from `board` (kBoardWords words that outlive this object), where one rank,
  // the one given `writes` true, records them; a choice with no board uses its own.
  void share(std::uint64_t* board, bool writes) {
    board_ = board;
    writes_board_ = writes;
  }

  // Whether the next collective, moving `bytes` in total, stages with streaming stores.
  bool streaming(std::size_t bytes);
  // Whether a collective moving `bytes` in total is measured: record() ignores the others.
  bool measures(std::size_t bytes) const {
    return mode_ == ShmStores::Auto && bytes >= kMeasuredBytes;
  }
  // The wall time of the collective streaming() answered last (moving `bytes` in total).
  void record(std::size_t bytes, std::chrono::nanoseconds took);
  // Collectives staged with streaming stores so far.
  std::uint64_t streamed() const { return streamed_; }
  // Collectives whose cost was learned from this rank's own measurement: all of them without a
  // board, none on the board's writer.
  std::uint64_t own_costs() const { return own_costs_; }

 private:
  // Takes measured collective `n`'s cost into the choice: the board's if it is there, else
  // this rank's own. Whether the other kind is now in use.
  bool learn(std::uint64_t n);
  // The longest wait between tries that the budget allows at the costs now known (both are),
  // within [kMinExplorePeriod, kMaxExplorePeriod].
  std::uint64_t explore_period() const;

  ShmStores mode_;
  std::uint64_t measured_ = 0;  // Measured collectives decided so far.
  // Nanoseconds per byte of each kind (index: streaming), 0 until measured. The kind in use
  // follows its collectives with a moving average; a sample of the other kind replaces its
  // value, which may date from an earlier placement.
  double cost_[2] = {0, 0};
  bool use_streaming_ = false;
  // The last collective that tried the kind not in use, or that switched kinds (it measured
  // both lately), and the measured collectives from it to the next try, before the budget's
  // limit (Note [How often the other kind is tried]).
  std::uint64_t last_try_ = 0;
  std::uint64_t period_ = kMinExplorePeriod;
  std::uint64_t streamed_ = 0;
  std::uint64_t own_costs_ = 0;
  // Of the last kBoardWords measured collectives (at n % kBoardWords): whether each streamed,
  // and its cost as this rank measured it, tagged as on the board (staging.cc, tagged()).
  bool streamed_at_[kBoardWords] = {};
  std::uint64_t own_[kBoardWords] = {};
  std::uint64_t* board_ = nullptr;
  bool writes_board_ = false;
};

// Chooses one collective's stores and, when it ends, records its time where the choice
// measures it (reading no clock for the small collectives, whose latency counts).
class StagingRun {
 public:
  StagingRun(StagingChoice& choice, std::size_t bytes)
      : choice_(choice),
        bytes_(bytes),
        streaming_(choice.streaming(bytes)),
        measured_(choice.measures(bytes)),
        start_(measured_ ? std::chrono::steady_clock::now()
                         : std::chrono::steady_clock::time_point{}) {}
  StagingRun(const StagingRun&) = delete;
  StagingRun& operator=(const StagingRun&) = delete;
  ~StagingRun() {
    if (measured_) choice_.record(bytes_, std::chrono::steady_clock::now() - start_);
  }

  bool streaming() const { return streaming_; }

 private:
  StagingChoice& choice_;
  std::size_t bytes_;
  bool streaming_;
  bool measured_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tutti::ops::shm
