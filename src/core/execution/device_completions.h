// SPDX-License-Identifier: Apache-2.0
// Completes device ops once the device has done their work.
//
// Note [Device completion]
// The communication thread enqueues a device batch on one of Tutti's streams (pack kernel,
// collective, unpack kernel) and moves on at once; it records an event after the batch and
// hands the ops over here. A thread of our own polls the pending events and completes each
// op's handle when its event has completed, so Handle::wait() returning means the outputs are
// in device memory, readable from any stream. Neither the communication thread nor the
// application thread ever blocks on the device. The thread starts with the first device op,
// so CPU-only jobs do not have it.
#pragma once

#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ops/device_ops.h"
#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/completer.h"
#include "src/core/tensor_queue.h"

namespace tutti::core {

class DeviceCompletions {
 public:
  // Ops complete through `completer` (Note [Completion]), which must outlive this object.
  explicit DeviceCompletions(const Completer& completer) : completer_(completer) {}
  ~DeviceCompletions();
  DeviceCompletions(const DeviceCompletions&) = delete;
  DeviceCompletions& operator=(const DeviceCompletions&) = delete;

  // Communication thread. Completes `entries` (with OK) once `event` has completed; keeps
  // `keep_alive` (memory the work reads, such as the fusion buffer) until then.
  void add(std::unique_ptr<ops::DeviceEvent> event, std::vector<std::shared_ptr<Entry>> entries,
           std::shared_ptr<void> keep_alive) TUTTI_EXCLUDES(mutex_);
  // Any thread. Whether ops are pending.
  bool busy() const;
  // Any thread. The first error an event reported (the ops of that event failed with it),
  // or OK.
  Status error() const TUTTI_EXCLUDES(mutex_);
  // Communication thread. Fails every pending op with `status` now (a peer was lost: their
  // events would never complete).
  void fail_all(const Status& status) TUTTI_EXCLUDES(mutex_);
  // Communication thread, at the end of a session: waits up to `timeout` for the pending ops,
  // fails the rest with `status`, and stops the thread.
  void finish(std::chrono::milliseconds timeout, const Status& status) TUTTI_EXCLUDES(mutex_);

 private:
  struct Pending {
    std::unique_ptr<ops::DeviceEvent> event;
    std::vector<std::shared_ptr<Entry>> entries;
    std::shared_ptr<void> keep_alive;
  };

  void run() TUTTI_EXCLUDES(mutex_);  // The device thread ("tutti-device").
  // Completes the pending ops whose events are done; true if any were.
  bool complete_ready() TUTTI_REQUIRES(mutex_);
  // Fails every pending op with `status` and empties the list.
  void fail_pending(const Status& status) TUTTI_REQUIRES(mutex_);

  const Completer& completer_;
  mutable detail::Mutex mutex_;
  detail::CondVar cv_;     // add() and finish() wake the thread.
  detail::CondVar empty_;  // The thread tells finish() that nothing is pending.
  std::list<Pending> pending_ TUTTI_GUARDED_BY(mutex_);
  // pending_.size(), readable without the lock: the communication thread asks every cycle.
  std::atomic<std::size_t> pending_count_{0};
  Status error_ TUTTI_GUARDED_BY(mutex_);
  bool stop_ TUTTI_GUARDED_BY(mutex_) = false;
  // Started by the first add(); joined by finish(), which the communication thread calls.
  std::thread thread_ TUTTI_GUARDED_BY(mutex_);
};

}  // namespace tutti::core
