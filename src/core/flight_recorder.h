// SPDX-License-Identifier: Apache-2.0
// The flight recorder behind tutti/debug.h: a ring of this rank's most recent collectives and
// how far each got, written as JSON when a job stalls or fails so that scripts/tutti-trace can
// line the ranks' rings up.
//
// Note [Flight recorder]
// A record is made for every op the queue accepts, in the order it accepted them (the order the
// coordinator is told about ops in; see Note [Records made as the queue is drained] for when),
// and updated as the op is negotiated, starts executing and completes (for a response list's ops,
// all at once as their batch ends: Note [Phases written as a batch ends]). The entry keeps its
// record's id, an ever-growing count; its slot is id % capacity, and an update whose slot has since
// been reused by a newer op is dropped (the old op's record is gone from the ring anyway). A steady
// workload records without allocating: slots hold what most ops have inline, and the strings beside
// the ring keep their capacity.
//
// Note [Two lines a record]
// Every op a rank submits is recorded, so the record is on the path of every op: P3's step of
// 10,000 tiny allreduces ran 11 % faster with the recorder off (0.888, 12 alternated pairs, AMD
// EPYC VM) when a record was a 168-byte slot of strings and a shape vector (four lines, one of
// them the vector's heap block, written at submission and again as the op moved on). A slot is
// now two aligned cache lines: the first holds the ids, times, phase and backend, the only line
// an update touches; the second the name and shape, written once. What does not fit (a name
// over 40 bytes, more than 3 dims, an error message) goes to strings beside the ring, one per
// slot, read only when the slot says so. That measured 0.96-1.02 in four series of alternated
// pairs, faster in 38 of 60: at most a few percent, within that VM's noise. With the recorder
// off the step was 0.914 (10 pairs); without the record's lock 0.968, with only its first line
// written 0.966, with no record at submission 0.905 (20 pairs each, upper bounds): the record
// made at submission is most of what is left.
//
// Note [Records made as the queue is drained]
// An op's record was made as the queue accepted it, under the recorder's lock: two atomic
// operations and a call on every op's submission path. Without that lock (not safe; an upper
// bound) P3's step of 10,000 tiny allreduces took 0.953 of its time (14 alternated pairs, faster
// in 12; AMD EPYC VM of family 26). So the queue stamps the op's submission time (the coarse
// clock) and records the ops it hands to the communication thread as it drains them, a batch
// under one lock (submitted_all()), in the order they were accepted. A snapshot or dump must
// still show the ops accepted and not yet drained (a communication thread stuck in a collective
// drains nothing, and those are the ops a hang's dump is read for): snapshot() and dump() first
// call the flush set by set_flush(), with which the queue records them at once. A record's id,
// sequence and submission time are therefore what they were when records were made at
// acceptance, and every accepted op is in every snapshot.
//
// Note [Phases written as a batch ends]
// A response list's ops were marked negotiated (the whole list), executing and done (each fused
// batch), three passes over their records, each a call, a lock-free slot check and a store per
// op. P3's driver (10,000 tiny allreduces a step, 2 ranks on the AMD EPYC VM of family 25 model
// 1) took 5-6 % less time with the first two passes left out (an upper bound: the ring then
// lied). So the response executor tells the recorder what its list is doing, not each op:
// list_negotiated() keeps the list's record ids and the time; batch_begun() and
// batch_executing() keep the running batch's positions, time and backend, no record touched;
// batch_finished() writes each of its records once, every phase's time in the one store of its
// first line. A reader (snapshot(), dump()) sees what the passes would have written: it applies
// the kept list to a copy of the ring (slots_shown()), so a hang's dump still says which ops are
// negotiated and which are executing on which backend. A device batch, which outlives the list
// (another thread finishes it), has its phases written as it is handed on (batch_deferred()).
// Callgrind, steady state (the difference between 32 and 12 steps, per op and rank): 3,354 and
// 3,257 instructions of work before, 3,264 and 3,158 after (examples/BENCHMARK_LOG.md,
// twenty-third round).
//
// Threads: every method may be called from any thread (application threads submit, the
// communication and device threads update, any thread reads or dumps); one mutex guards the
// ring, held for a slot's copy at most (a drained batch's slots in submitted_all(), a finished
// batch's in batch_finished(), the whole ring's in slots_shown()). Lock order:
// the flush's mutex, then the queue's, then the ring's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/coarse_clock.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/request.h"
#include "tutti/debug.h"

namespace tutti::core {

// How far a recorded op got, in order.
enum class OpPhase : std::uint8_t { Submitted, Negotiated, Executing, Done, Failed };

// What a dump says about the job besides the ring, and where dumps go by default.
struct DumpContext {
  std::string job;  // The same on every rank of the job (Config::job_id).
  int rank = 0;
  int size = 1;
  std::string dir;  // TUTTI_FLIGHT_RECORDER_DIR; empty: see default_dump_path().
};

class FlightRecorder {
 public:
  // `capacity` 0: records nothing (every method is then one branch).
  explicit FlightRecorder(std::size_t capacity);

  bool enabled() const { return capacity_ > 0; }

  // Records a newly accepted op, the `sequence`-th of its set on this rank (Entry::sequence),
  // submitted at `at` (Entry::submitted, where the caller took a clock reading anyway); a
  // default time point means now, read from the coarse clock, since an exact read would cost
  // as much as the rest of the record (Note [Coarse clock] in src/base/coarse_clock.h: the stamp
  // may be up to a tick, 4 ms, early). Returns the record's id for the updates below, or -1
  // when disabled.
  std::int64_t submitted(const Request& request, std::int64_t sequence,
                         std::chrono::steady_clock::time_point at = {}) TUTTI_EXCLUDES(mutex_);
  // An op to record with submitted_all(): submitted()'s arguments, and where its id goes (null:
  // the op has a record already).
  struct Accepted {
    const Request* request = nullptr;
    std::int64_t sequence = 0;
    std::chrono::steady_clock::time_point at;
    std::int64_t* record = nullptr;
  };
  // submitted() for each of `items` under one lock (Note [Records made as the queue is
  // drained]), in order; `accepted_of(item)` says what to record.
  template <class Items, class AcceptedOf>
  void submitted_all(const Items& items, AcceptedOf accepted_of) TUTTI_EXCLUDES(mutex_) {
    if (!enabled()) return;
    detail::MutexLock lock(mutex_);
    for (const auto& item : items) {
      const Accepted accepted = accepted_of(item);
      if (accepted.record != nullptr)
        *accepted.record = record_locked(*accepted.request, accepted.sequence, accepted.at);
    }
  }
  // What snapshot() and dump() call first, outside the ring's lock, so that ops accepted but
  // not yet recorded get their records (the queue's; Note [Records made as the queue is
  // drained]). An empty function removes it; whoever set one removes it before it may no longer
  // be called.
  void set_flush(std::function<void()> flush) TUTTI_EXCLUDES(flush_mutex_);
  // Moves the op to `phase` (never back); `backend` ("shm", "mpi", ...) once it executes,
  // `error` when it failed. No-op for id -1 or a record already overwritten.
  void update(std::int64_t id, OpPhase phase, std::string_view backend = {},
              std::string_view error = {}) TUTTI_EXCLUDES(mutex_);
  // ---- A response list's ops, whose phases are written once, as their batch ends (Note
  // [Phases written as a batch ends]). The response executor's thread calls these in order:
  // list_negotiated(), then per batch batch_begun(), batch_executing() where it runs a
  // collective, and batch_finished() or batch_deferred(); then list_ended().
  //
  // The list's ops, negotiated now: `id_of(item)` of each of `items` in order (-1: no record).
  // Batches name their ops by position in `items`. Replaces a list not ended.
  template <class Items, class IdOf>
  void list_negotiated(const Items& items, IdOf id_of) TUTTI_EXCLUDES(mutex_) {
    if (!enabled()) return;
    const double now = now_s();
    detail::MutexLock lock(mutex_);
    list_.ids.clear();
    for (const auto& item : items) list_.ids.push_back(id_of(item));
    list_.negotiated_s = now;
    list_.written = 0;
    list_.batch.clear();
    list_.executing_s = -1;
    list_.batch_deferred = false;
  }
  // The list's next batch: the ops at `positions` in it.
  void batch_begun(std::span<const std::size_t> positions) TUTTI_EXCLUDES(mutex_);
  // The batch starts executing now, on `backend` ("shm", "mpi", ...).
  void batch_executing(std::string_view backend) TUTTI_EXCLUDES(mutex_);
  // The batch ended: each of its records gets the list's negotiation time, the batch's
  // execution time and backend, and `phase` (Done, or Failed with `error`) stamped now.
  void batch_finished(OpPhase phase, std::string_view error = {}) TUTTI_EXCLUDES(mutex_);
  // The batch stays in flight after the list (a device batch, which another thread finishes
  // with update()): its records are marked negotiated and executing now, as they stand. A
  // batch_finished() after it (the hand-over failed) still finishes them.
  void batch_deferred() TUTTI_EXCLUDES(mutex_);
  // The list is done. Ops of it that no batch finished or deferred are marked negotiated.
  void list_ended() TUTTI_EXCLUDES(mutex_);

  // The ring, oldest first.
  std::vector<debug::OpRecord> snapshot() const TUTTI_EXCLUDES(mutex_);

  // The job facts the next dumps carry, set once by the session.
  void set_context(DumpContext context) TUTTI_EXCLUDES(mutex_);
  // The process sets (id -> sorted global ranks) the next dumps list; kept current by whoever
  // changes them (the session, the response executor).
  void set_process_sets(std::map<int, std::vector<int>> sets) TUTTI_EXCLUDES(mutex_);
  // Where dump() goes when the user names no path: default_dump_path(context's dir, rank).
  std::string default_path() const TUTTI_EXCLUDES(mutex_);
  // Where a signal's dump goes (`signal` "SIGTERM", "SIGUSR1"): default_path(), or, once
  // error_dump_path() was asked for, rank<R>.<signal>.json beside it. The dump of the error that
  // stopped the runtime (a stuck rank's "Stalled: ...") explains the job; the SIGTERM that
  // MPI_Abort or mpirun sends next would otherwise replace it with one that says only "SIGTERM".
  std::string signal_dump_path(std::string_view signal) const TUTTI_EXCLUDES(mutex_);
  // default_path(), for the dump of an error that stopped the runtime; from now on
  // signal_dump_path() leaves that file alone. Asked for before that dump is written, so that a
  // signal's dump racing with it goes beside it too.
  std::string error_dump_path() TUTTI_EXCLUDES(mutex_);
  // Writes the ring as JSON (format: README "Flight recorder") to `path`, through a temporary
  // file renamed over it, so a reader never sees half a dump. `reason` says why ("stall: ...",
  // "SIGUSR1"). InvalidArgument naming the path and the OS's reason on failure.
  Status dump(const std::string& path, std::string_view reason) const TUTTI_EXCLUDES(mutex_);

 private:
  using Clock = std::chrono::steady_clock;
  // See Note [Two lines a record]. Sizes that fit them: names of up to kInlineName bytes,
  // shapes of up to kInlineDims dims.
  static constexpr std::size_t kInlineDims = 3;
  static constexpr std::size_t kInlineName = 40;
  static constexpr std::uint8_t kBeside = 0xff;  // name_size / dims: in long_names_ / long_shapes_.
  struct alignas(64) Slot {
    // The first line: what every update reads and writes.
    std::int64_t id = -1;  // -1: never used.
    std::int64_t sequence = 0;
    // Seconds since the recorder started; -1 until reached.
    double submitted_s = -1, negotiated_s = -1, executing_s = -1, finished_s = -1;
    int process_set_id = 0;
    std::int32_t tensors = 0;
    Collective op = Collective::Allreduce;
    DataType dtype = DataType::Float32;
    OpPhase phase = OpPhase::Submitted;
    std::uint8_t backend = 0;        // 1 + its index in backend_names_; 0 until the op executes.
    std::uint8_t name_size = 0;      // Of `name`, or kBeside.
    std::uint8_t dims = 0;           // Of `shape`, or kBeside.
    bool failed_with_error = false;  // errors_ holds the message.
    // The second line, written once, when the op is submitted.
    std::int64_t shape[kInlineDims] = {};
    char name[kInlineName] = {};
  };
  static_assert(sizeof(Slot) == 128, "a record is two cache lines (Note [Two lines a record])");

  double now_s() const;
  // submitted()'s record, the caller holding the lock.
  std::int64_t record_locked(const Request& request, std::int64_t sequence, Clock::time_point at)
      TUTTI_REQUIRES(mutex_);
  // Calls the flush set by set_flush(), if any.
  void flush() const TUTTI_EXCLUDES(flush_mutex_, mutex_);
  double seconds_at(Clock::time_point at) const;
  // Moves the record of `id` in `ring` (slots_, or a reader's copy of it) to `phase`, stamping
  // `at` (and `backend`, as intern() gives it, when executing), if the ring still holds that op
  // and it has not got so far. The slot it moved, or null.
  Slot* advance(std::vector<Slot>& ring, std::int64_t id, OpPhase phase, double at,
                std::uint8_t backend) const;
  // update()'s change of one slot, at time `now`; `backend` as intern() gives it.
  void apply(std::int64_t id, OpPhase phase, double now, std::uint8_t backend,
             std::string_view error) TUTTI_REQUIRES(mutex_);
  // Marks the list's ops at `positions` negotiated and, if the batch began executing,
  // executing, as the per-op updates would have (batch_deferred(), list_ended(), reads).
  void apply_pending(std::span<const std::size_t> positions, bool executing) TUTTI_REQUIRES(mutex_);
  // The ring's slots as a reader sees them: the list's pending phases applied (Note [Phases
  // written as a batch ends]). A copy, made only for snapshot() and dump().
  std::vector<Slot> slots_shown() const TUTTI_REQUIRES(mutex_);
  // Backend name `name`'s number in backend_names_ plus 1, adding it the first time (a job has a
  // few); 0 for an empty name. A slot then holds a byte, not a copy: an op's record costs no
  // string copy as it starts executing.
  std::uint8_t intern(std::string_view name) TUTTI_REQUIRES(mutex_);
  std::string_view name_of(std::size_t index, const Slot& slot) const TUTTI_REQUIRES(mutex_);
  Shape shape_of(std::size_t index, const Slot& slot) const TUTTI_REQUIRES(mutex_);
  // The record of `slot`, the ring's `index`-th (as slots_shown() shows it).
  void append_json(std::string& out, std::size_t index, const Slot& slot) const
      TUTTI_REQUIRES(mutex_);

  // The response list in flight (Note [Phases written as a batch ends]).
  struct PendingList {
    std::vector<std::int64_t> ids;   // Record ids by position; -1: none.
    double negotiated_s = -1;        // When list_negotiated() was called.
    std::size_t written = 0;         // Positions whose records batches have written.
    std::vector<std::size_t> batch;  // The current batch's positions; empty: none.
    double executing_s = -1;         // When the current batch began executing; -1: not yet.
    std::uint8_t backend = 0;        // Its backend, as intern() gives it.
    bool batch_deferred = false;     // batch_deferred() wrote its records' phases.
  };
  PendingList list_ TUTTI_GUARDED_BY(mutex_);
  const std::size_t capacity_;
  // Taken before the queue's lock and the ring's (Note [Records made as the queue is drained]).
  mutable detail::Mutex flush_mutex_;
  std::function<void()> flush_ TUTTI_GUARDED_BY(flush_mutex_);
  // A coarse reading (Note [Coarse clock] in src/base/coarse_clock.h): records are stamped with
  // the coarse clock, which may lag an exact reading by a tick; an origin read exactly made an op
  // submitted right after init() read as submitted before it (-0.004 s).
  const Clock::time_point origin_ = base::coarse_now();
  mutable detail::Mutex mutex_;
  std::vector<std::string> backend_names_ TUTTI_GUARDED_BY(mutex_);
  std::vector<Slot> slots_ TUTTI_GUARDED_BY(mutex_);
  // Beside the ring, one per slot, touched only for what does not fit the slot: names longer
  // than kInlineName, shapes of more than kInlineDims dims, and errors.
  std::vector<std::string> long_names_ TUTTI_GUARDED_BY(mutex_);
  std::vector<Shape> long_shapes_ TUTTI_GUARDED_BY(mutex_);
  std::vector<std::string> errors_ TUTTI_GUARDED_BY(mutex_);
  std::int64_t next_id_ TUTTI_GUARDED_BY(mutex_) = 0;
  DumpContext context_ TUTTI_GUARDED_BY(mutex_);
  bool error_dumped_ TUTTI_GUARDED_BY(mutex_) = false;  // error_dump_path() was asked for.
  std::map<int, std::vector<int>> sets_ TUTTI_GUARDED_BY(mutex_);
};

// TUTTI_FLIGHT_RECORDER_DIR/rank<R>.json, `dir` defaulting to $TMPDIR/tutti-flight-recorder;
// rank<R>.<tag>.json for a non-empty `tag`.
std::string default_dump_path(const std::string& dir, int rank, std::string_view tag = {});

std::string_view to_string(OpPhase phase);

}  // namespace tutti::core
