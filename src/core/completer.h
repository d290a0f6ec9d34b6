// SPDX-License-Identifier: Apache-2.0
// The one place where an op's handle is completed.
//
// Note [Completion]
// An op ends in one of these ways, all through Completer::complete():
//  - the response executor ran it (host ops), or found the coordinator's error for it;
//  - the device thread saw its event complete, or fail (Note [Device completion]);
//  - its process set was removed while it was in flight (ShutDown);
//  - the session ended before it ran (ShutDown, Stalled, or the fault that stopped it).
// Completing writes the op's end into the timeline and the flight recorder first, then releases the
// handle, so a waiter that wakes finds the span closed. Results (outputs, splits) are written
// before.
//
// Note [Waking a batch at its end]
// A fused batch completes thousands of ops, and the application usually waits on them in
// order. Woken as soon as its op was done, a waiter on a CPU it shares with this thread runs
// at once (the kernel favours the thread that slept), finds the next op not done yet, and
// sleeps again: two context switches per op, until the scheduler stops favouring it. A
// Completer::Batch makes every op of the batch done first and wakes the sleepers after the
// last, so the waiter wakes once and finds the rest done too. Its wake-up moves later by the
// rest of the batch's completion, a few tens of ns an op. P3 (100 steps of 10,000 tiny ops,
// 2 ranks each bound to a core of the 2-core AMD EPYC VM, three alternated runs): 126,876-
// 134,879 context switches on rank 0 before, 1,961-2,228 after; the step time did not change
// beyond the VM's noise (the work, not the switching, bounds it there).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "src/common/status.h"
#include "src/core/flight_recorder.h"
#include "src/core/tensor_queue.h"
#include "src/core/timeline.h"

namespace tutti::core {

// Any thread (the communication thread and the device thread complete ops).
class Completer {
 public:
  // `timeline` and `recorder` may be null (none) and must outlive the completer.
  explicit Completer(Timeline* timeline, FlightRecorder* recorder = nullptr)
      : timeline_(timeline), recorder_(recorder) {}

  // Completes the op with `status`, after marking it in the timeline and, unless `record` is
  // false (the caller marked a whole batch: FlightRecorder::update_all), the flight recorder.
  void complete(Entry& entry, const Status& status, bool record = true) const;
  // Completes every op of `entries` as one batch (Batch, below).
  void complete(std::span<const std::shared_ptr<Entry>> entries, const Status& status) const;

  // Ops completed together: each is done at once, and threads asleep on them are woken when
  // the batch ends (Note [Waking a batch at its end]). The thread that made it.
  class Batch {
   public:
    explicit Batch(const Completer& completer) : completer_(completer) {}
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    ~Batch();  // Wakes the sleepers.
    // As Completer::complete(), but wakes any thread that sleeps on the op only at the end.
    void complete(const std::shared_ptr<Entry>& entry, const Status& status, bool record = true);

   private:
    const Completer& completer_;
    // Owning (handle_state()): a waiter that woke by itself and found its op done may drop its
    // handle, and the caller its entry, before the batch ends.
    std::vector<std::shared_ptr<detail::OpState>> to_wake_;
  };

 private:
  // Marks the timeline and (if `record`) the flight recorder; true if `entry`'s state has a
  // sleeper to wake.
  [[nodiscard]] bool finish(Entry& entry, const Status& status, bool record) const;

  Timeline* timeline_;
  FlightRecorder* recorder_;
};

}  // namespace tutti::core
