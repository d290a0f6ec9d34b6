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
#pragma once

#include <memory>
#include <span>

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
  // false (the caller wrote a whole batch: FlightRecorder::batch_finished()), the flight recorder.
  void complete(Entry& entry, const Status& status, bool record = true) const;
  void complete(std::span<const std::shared_ptr<Entry>> entries, const Status& status) const;

 private:
  Timeline* timeline_;
  FlightRecorder* recorder_;
};

}  // namespace tutti::core
