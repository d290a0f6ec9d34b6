// SPDX-License-Identifier: Apache-2.0
// The ops this rank has submitted and not yet finished: a table by (process set, name) and a
// FIFO of those not yet sent to the coordinator. An op submitted without a name gets one here
// (Note [Automatic names] in automatic_name.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "src/base/inline_vector.h"
#include "src/base/prefetch.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/flight_recorder.h"
#include "src/core/name_index.h"
#include "src/core/op_key.h"
#include "src/core/op_state.h"
#include "src/core/request.h"

namespace tutti::core {

// One submitted op on this rank.
struct Entry {
  // The hash of (set, name) that push() filed the entry under (Note [Name index]), for the
  // response cache's lookup to reuse. First, beside the request's set and name: the lookup
  // reads the three together (Note [Lookup pipeline] in negotiation/request_sender.cc).
  std::uint64_t name_hash = 0;
  Request request;
  // One view in place: nearly every op has one tensor (grouped ops spill to the heap). Like
  // `outputs`, without their shapes (Note [Views kept without their shapes]).
  base::InlineVector<TensorView, 1> inputs;
  // Where the results go, one view per input; empty for in-place ops (`in_place`: output(t) is
  // inputs[t]) and where core allocates the results. Read them through output(). On the heap,
  // unlike `inputs`: most ops have no output views, and an inline one would be 64 bytes more
  // in every op's record.
  std::vector<TensorView> outputs;
  // The state the op's Handle shares. In an entry from make_entry() it lives in the entry's own
  // allocation and this pointer does not own it (the entry keeps it alive): hand out
  // handle_state(), never a copy of this pointer, to anything that may outlive the entry.
  std::shared_ptr<detail::OpState> state;
  // When the caller submitted the op, where it took a clock reading (point-to-point ops, whose
  // engine measures waits from it); for collectives the coarse clock at push() where a flight
  // recorder is on (its only reader; Note [Coarse clock] in src/base/coarse_clock.h), else unset
  // (the epoch).
  std::chrono::steady_clock::time_point submitted;
  std::int32_t cache_hit = -1;  // The cache id this rank sent instead of `request`, or -1.
  bool in_place = false;        // See `outputs`. Here, where it fills what was padding.
  // In the queue's list of ops not yet drained (TensorQueue's, under its lock). Beside
  // in_place, in what was padding too.
  bool queued = false;
  // CUDA ops: the submitting thread's current stream at the call, which Tutti's stream waits
  // for before the op's device work (Note [Stream ordering] in ops/cuda/stream.h). Null once
  // that wait is enqueued, and for CPU ops.
  std::unique_ptr<ops::DeviceEvent> ready;
  std::int64_t record = -1;  // The op's flight-recorder id (Note [Flight recorder]), or -1.
  // Its place among this rank's ops of its set, from 0 in each session, in the order the
  // coordinator is told of them: the flight recorder's sequence number, and what the desync
  // check compares (Note [Desync check] in negotiation/desync_check.h).
  std::int64_t sequence = 0;

  // The view the op writes its `t`-th result into.
  const TensorView& output(std::size_t t) const { return in_place ? inputs[t] : outputs[t]; }
};

// Note [Views kept without their shapes]
// A TensorView's shape is a std::vector (API.md's type): a heap block for every view. The op's
// request has the shapes (its TensorSpecs, in place), and what runs the op reads only each
// view's data, dtype, device and element count. So the submission frees each view's shape as
// it queues the op (detail::TensorViewAccess in op_state.h), while the block is still in the
// cache, rather than with the op's record, a step later where a step has thousands of ops,
// when the free read a cold block header. P3 (10,000 tiny ops a step, 2 ranks on the 2-core
// AMD EPYC VM): 0.96 of the step (examples/BENCHMARK_LOG.md, fourteenth round). Read an op's shapes
// from `request.tensors`, never from its views.

// Start loading what a lookup by (set, name) reads of `entry`: prefetch_key() its hash and its
// request's set and name, prefetch_request() all of its request as well (what the response
// cache's lookup compares). For loops over many entries: Note [Lookup pipeline] in
// negotiation/request_sender.cc.
[[gnu::always_inline]] inline void prefetch_key(const Entry& entry) {
  base::prefetch_lines(&entry.name_hash, &entry.request.name + 1);
}
[[gnu::always_inline]] inline void prefetch_request(const Entry& entry) {
  base::prefetch_lines(&entry.name_hash, &entry.request + 1);
}

// An Entry with its OpState in one allocation (the API's ops make one per call).
std::shared_ptr<Entry> make_entry();
// An owning pointer to `entry`'s state, for the Handle: it keeps the entry's allocation alive.
std::shared_ptr<detail::OpState> handle_state(const std::shared_ptr<Entry>& entry);

// Application threads push; the communication thread drains, takes and closes.
class TensorQueue {
 public:
  // `recorder` (null: none) records each accepted op, as drain_new() hands it on or when the
  // recorder is read first (Note [Records made as the queue is drained] in
  // flight_recorder.h); it must outlive the queue.
  explicit TensorQueue(FlightRecorder* recorder = nullptr);
  ~TensorQueue();
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;

  // Any thread. InvalidArgument if the name is in flight in its set; ShutDown after close().
  // Fills in an automatic name when the request has none, the entry's sequence number, and
  // (for the recorder) its submission time where the caller left it unset.
  Status push(std::shared_ptr<Entry> entry) TUTTI_EXCLUDES(mutex_);

  // Communication thread. Entries pushed since the last call, oldest first. The queue owns
  // them (Note [Ops not yet drained]): each pointer is valid until its entry is taken (take(),
  // take_all(), take_set()) or the queue is closed, so the caller uses them before it does any
  // of those (the loop's cycle, and its end, which closes the queue, run one at a time).
  std::vector<Entry*> drain_new() TUTTI_EXCLUDES(mutex_);
  // Communication thread. As drain_new(), appending to `into`; when `into` is empty the queue
  // keeps its buffer for the next pushes, so that a caller that clears and reuses one vector
  // lets a steady stream of ops allocate no queue memory.
  void drain_new(std::vector<Entry*>* into) TUTTI_EXCLUDES(mutex_);
  // Communication thread. Removes and returns the in-flight entry, or null.
  std::shared_ptr<Entry> take(int process_set_id, std::string_view name) TUTTI_EXCLUDES(mutex_);
  // One op for take_all(): its key, the key's hash (name_hash()), and what it took.
  struct Take {
    OpKeyView key;
    std::uint64_t hash = 0;
    std::shared_ptr<Entry> entry;  // Filled in: the in-flight entry, or null.
  };
  // Communication thread. take() for each of `takes`, in order: a response list's ops, taken
  // a few hundred per lock and with their index slots prefetched (Note [Name index]).
  void take_all(std::span<Take> takes) TUTTI_EXCLUDES(mutex_);
  // Communication thread. A member that joined executes ops it never submitted; when one
  // carries an automatic name "<op>.noname.<n>", the set's counter moves past n, so that this
  // rank's next unnamed op matches the others' after the join (see Note [Join] in
  // negotiation/coordinator.h). Other names are ignored.
  void skip_automatic_name(int process_set_id, std::string_view name) TUTTI_EXCLUDES(mutex_);
  // Communication thread. Removes and returns every in-flight entry of a set (being removed).
  std::vector<std::shared_ptr<Entry>> take_set(int process_set_id) TUTTI_EXCLUDES(mutex_);
  // Communication thread. The in-flight entries that were sent as the cache hits `ids`, in the
  // order of `ids` (an id given twice counts at its first place). One pass over the ops in
  // flight, whatever the number of ids: a cache too small for a step's ops has the coordinator
  // ask back hundreds of hits a cycle, with thousands of ops in flight (Note [Resends in one
  // pass] in tensor_queue.cc).
  std::vector<std::shared_ptr<Entry>> with_cache_hits(std::span<const std::int32_t> ids) const
      TUTTI_EXCLUDES(mutex_);
  // Communication thread. Whether anything is in flight.
  bool empty() const TUTTI_EXCLUDES(mutex_);

  // Any thread. Refuses later pushes with `status`; returns every entry in flight (for the
  // caller to fail).
  std::vector<std::shared_ptr<Entry>> close(const Status& status) TUTTI_EXCLUDES(mutex_);

  // Communication thread: sleeps until a push, a wake(), or `timeout`.
  void wait_for_work(std::chrono::microseconds timeout) TUTTI_EXCLUDES(mutex_);
  void wake() TUTTI_EXCLUDES(mutex_);  // Any thread.

  // How long a thread that finds the queue's lock held spins before it sleeps on it (Note
  // [The queue's lock on spare CPUs]); zero, the default, sleeps at once. Set before any
  // other thread uses the queue.
  void spin_on_contention(std::chrono::nanoseconds spin) { spin_ = spin; }

 private:
  // Records the entries of new_ that have no record yet, in order, under one recorder lock.
  void record_new() TUTTI_REQUIRES(mutex_);
  // Called for each entry taken out of in_flight_: an entry not yet drained leaves new_ too,
  // which must not point at an entry the queue no longer owns (Note [Ops not yet drained]).
  void forget_queued(Entry& entry) TUTTI_REQUIRES(mutex_);

  FlightRecorder* const recorder_;
  // Note [The queue's lock on spare CPUs]
  // Submitting threads push under the queue's lock while the communication thread drains, takes
  // and records under it, each for a microsecond or a few. Where the two run on CPUs of their
  // own, a burst of submissions meets the lock held over and over, and a std::mutex sleeps at
  // once: a system call and a context switch to sleep, one more for the holder to wake the
  // sleeper. P3's driver at one rank, the rank unbound on the 2-core AMD EPYC VM (its two
  // threads on two CPUs, as on a host with spare cores), spent 38 % of its samples in the
  // kernel switching and waking, about 75 sleeps of the submitter a step, and took 3.9-4.6 ms
  // a step against 1.9 with both threads bound to one core (1.5-2.4 ms with the spin). Spinning a
  // few microseconds before sleeping fits the lock's short holds; where the threads share a CPU the
  // holder cannot run while a waiter spins, so there the lock sleeps at once, as before
  // (CpuSharing::lock_spin).
  std::chrono::nanoseconds spin_{0};
  mutable detail::Mutex mutex_;
  detail::CondVar cv_;
  // The communication thread waits on cv_; push() must notify.
  bool sleeping_ TUTTI_GUARDED_BY(mutex_) = false;
  bool woken_ TUTTI_GUARDED_BY(mutex_) = false;
  Status closed_ TUTTI_GUARDED_BY(mutex_);  // OK while open.
  // Note [Ops not yet drained]
  // The ops pushed and not yet drained, in push order. in_flight_ owns every op until it is
  // taken; this list only points at the ones it also holds (Entry::queued), so a push copies no
  // shared pointer (an atomic count up, and one down once the op is drained: two locked
  // instructions, some 3 % of P3's 10,000-op step; examples/BENCHMARK_LOG.md, fourteenth round). An
  // op taken before it is drained (its set removed, the queue closed, or a response that reaches a
  // rank that joined while one of its threads still submits) leaves this list as it is taken.
  std::vector<Entry*> new_ TUTTI_GUARDED_BY(mutex_);
  // Keyed by the entry's own (set, name), which stays unchanged while it is in the table. A
  // steady workload allocates no table memory: the index only grows.
  struct EntryKey {
    OpKeyView operator()(const std::shared_ptr<Entry>& entry) const {
      return OpKeyView{entry->request.process_set_id, entry->request.name};
    }
  };
  NameIndex<std::shared_ptr<Entry>, EntryKey> in_flight_ TUTTI_GUARDED_BY(mutex_);
  std::map<int, std::uint64_t> unnamed_counts_ TUTTI_GUARDED_BY(mutex_);
  std::map<int, std::int64_t> next_sequence_ TUTTI_GUARDED_BY(mutex_);  // By process set.
};

}  // namespace tutti::core
