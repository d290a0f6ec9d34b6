// SPDX-License-Identifier: Apache-2.0
#include "src/core/negotiation/request_sender.h"

#include <algorithm>
#include <cstddef>
#include <thread>

#include "src/core/op_state.h"

namespace tutti::core {

// Note [Batching on a shared CPU]
// Where the submitting threads run on this thread's CPU, a submission that wakes this thread
// also stops the submitter (the woken thread runs first), so draining again at once finds
// nothing new: a burst of ops went out a few at a time, each few costing two context switches
// (P3, 10,000 tiny ops a step: about 1,100 context switches per step on the coordinator).
// There the batch loop yields before each drain while no application thread waits, letting the
// submitter go on; once it waits, or the cycle time is up, the list goes. The yield may keep
// the list back for a scheduler tick when the submitter computes on without waiting, but then
// nothing here could have run anyway without taking the CPU from it. P3 on the 2-core AMD
// EPYC VM (2 ranks, each bound to one core; two runs each way, alternated): 10.7-12.8 ms
// without the yield, 8.1-8.7 ms with it, and about 500 context switches per step on the
// coordinator; P2 unchanged (the lone op's submitter waits at once).

// Note [Lookup pipeline]
// A step of thousands of ops does not fit in a core's cache: by the time the communication
// thread looks an op up, the op's entry (written when it was submitted) and the cached request
// it is compared with (written when the op was first negotiated) have left it, and each lookup
// waited for three cache misses in turn: the entry's name and hash, the index slot the hash
// picks, and the cached request the slot points to. A lookup cannot start the next miss before
// the previous one ends, but lookups of different ops can: the loop below runs them as a
// pipeline of four stages, each kStride ops behind the one before, so that the misses of about
// 3 * kStride ops are in flight at once. P3 (10,000 tiny ops a step, 2 ranks on the 2-core AMD
// EPYC VM): its step took about twice as long per op at 10,000 ops as at 1,000, the same
// instructions per op; examples/BENCHMARK_LOG.md (ninth round) has the figures.

// Note [Lookup by the next id]
// A training step submits its ops in the order of the step before, and the response cache
// numbered them in the order it first negotiated them, so in a steady step op k + 1 hits the id
// after op k's. The lookup tries that id first, reading only its slot (RankCache::matches()),
// and goes to the index by name only when it does not match. The index held one slot of every
// cached name, a table larger than the core's cache (786 KB at 10,000 names), and each op's
// slot was a miss that the pipeline's prefetch did not hide: `perf` put about a tenth of P3's
// samples on each rank on that one load. The ids' slots are consecutive in their own table, and
// the slot the match reads is the one the lookup would compare anyway. While ops hit in order
// the pipeline loads each one's expected slot. After an op that did not, the lookups go by name
// (and the pipeline loads the index's slots) until one finds the id expected, so a workload that
// submits in a new order each step is looked up as before, without a failed match (a cold slot
// read) per op. examples/BENCHMARK_LOG.md (thirteenth round) has the figures.

std::optional<RequestList> RequestSender::take_new(bool batch_by_yielding) {
  // A rank's last message is its last (Note [Shutdown handshake]); ops still queued then are
  // failed when the session ends.
  if (last_sent_) return std::nullopt;
  queue_.drain_new(&entries_);
  if (entries_.empty()) return std::nullopt;
  // Batch while ops keep arriving: drain again until a drain finds nothing new, for at most the
  // cycle time. A lone op goes out at once (waiting even 3 us for company measurably slowed P2,
  // the lone op's latency), and the ops of a burst that arrive while this list is on its way
  // make the next one.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + cycle_time_;
  for (std::size_t before = 0; entries_.size() > before && Clock::now() < deadline;) {
    before = entries_.size();
    // See Note [Batching on a shared CPU].
    if (batch_by_yielding && shares_cpu_ && !detail::app_threads_waiting())
      std::this_thread::yield();
    queue_.drain_new(&entries_);
  }
  RequestList list;
  list.cache_hits.reserve(entries_.size());
  // See Note [Lookup pipeline]: entry j's lines, entry j - kStride's index slot and entry
  // j - 2 * kStride's cached request start loading as entry j - 3 * kStride is looked up. While
  // the ops hit the ids after one another (Note [Lookup by the next id]), the index by name is
  // left alone: entry j - 2 * kStride's slot by its expected id loads instead.
  constexpr std::size_t kStride = 8;
  const std::size_t n = entries_.size();
  for (std::size_t j = 0; j < n + 3 * kStride; ++j) {
    if (j < n) prefetch_request(*entries_[j]);
    if (in_order_) {
      if (j >= 2 * kStride && j - 2 * kStride < n)
        cache_.prefetch_id(next_id_ + static_cast<std::int32_t>(kStride));
    } else {
      if (j >= kStride && j - kStride < n) cache_.prefetch(entries_[j - kStride]->name_hash);
      if (j >= 2 * kStride && j - 2 * kStride < n)
        cache_.prefetch_request(entries_[j - 2 * kStride]->name_hash);
    }
    if (j < 3 * kStride) continue;
    Entry& entry = *entries_[j - 3 * kStride];
    std::optional<std::int32_t> id;
    if (in_order_ && cache_.matches(next_id_, entry.request, entry.name_hash)) {
      id = next_id_;
    } else {
      id = cache_.lookup(entry.request, entry.name_hash);
      in_order_ = id == next_id_;
    }
    if (id) {
      entry.cache_hit = *id;
      list.cache_hits.push_back(*id);
      next_id_ = *id + 1;
    } else {
      list.requests.push_back(entry.request);
      if (send_sequences_) list.sequences.push_back(entry.sequence);
    }
  }
  entries_.clear();  // Keeps its buffer, which drain_new() swaps with the queue's.
  return list;
}

std::optional<RequestList> RequestSender::take_resend(std::span<const std::int32_t> ids) {
  if (last_sent_ || ids.empty()) return std::nullopt;
  RequestList again;
  for (const auto& entry : queue_.with_cache_hits(ids)) {
    entry->cache_hit = -1;
    again.requests.push_back(entry->request);
  }
  return again;
}

RequestList RequestSender::take_last(const Status& why) {
  last_sent_ = true;
  RequestList last;
  last.shutdown = true;
  last.shutdown_after_error = !why.ok();
  if (!why.ok()) {
    last.shutdown_code = why.code();
    last.shutdown_message = std::string(why.message());
  }
  return last;
}

}  // namespace tutti::core
