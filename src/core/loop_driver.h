// SPDX-License-Identifier: Apache-2.0
// The collectives' cycle, run by the application thread that waits on one of its ops.
//
// Note [A waiting thread runs the cycle]
// A lone small collective went through four hand-offs between a rank's application thread
// and its communication thread: the submission wakes the loop, the loop sends the request,
// the answer arrives, the completion wakes the waiter. Where the two threads share a CPU
// (as many ranks as cores, each bound to one) every hand-off is a wake-up and a context switch
// of a few microseconds, most of the lone allreduce's latency (P2).
// So, as a waiting thread steps point-to-point ops (Note [A waiting thread drives
// point-to-point] in execution/p2p_engine.h), a thread in OpState::wait() on a collective
// runs the loop's cycle itself for up to 200 us, under the cycle lock that the communication
// thread also holds around each of its cycles:
//  - take_over() counts it as a driver. While there are drivers the communication thread runs
//    no cycle: it sleeps until one hands back or lets go with ops in flight, or 1 ms passes,
//    after which it runs one cycle itself, so that a stream of overlapping drivers cannot keep
//    it from a stop request;
//  - drive() runs one cycle if it gets the lock at once, and yields otherwise (the thread that
//    holds it may need this CPU to finish);
//  - let_go() (its op is done) wakes the communication thread only if ops are still in flight,
//    so a lone op costs no wake-up at all; hand_back() (not done: the thread sleeps) always
//    does, and the thread counts itself as waiting first, so the loop polls for it.
// A cycle that does work resets the loop's idle clock, whoever ran it.
// A cycle on an application thread makes the communication thread's MPI calls, so driving
// needs MPI_THREAD_MULTIPLE; and it spins, so not where ranks outnumber the host's CPUs (the
// CPU it keeps is one a peer needs). Device ops stay on the communication thread (its CUDA
// device and streams are its own), so a process that sees a device does not drive at all.
// Handle::poll() runs no cycle: it never blocks, and a cycle may (a collective waits for its
// peers).
// The first error of a driven cycle is kept, no cycle is driven after it, and the loop stops
// on it as on its own. The loop decides to stop under the cycle lock and ends driving before
// it lets the lock go (stop_driving()), so no cycle runs after its last: after a transport
// fault the peers are in an unknown state.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>

#include "src/common/mutex.h"
#include "src/common/status.h"
#include "src/core/op_state.h"

namespace tutti::core {

class LoopDriver final : public detail::Driver {
 public:
  // One cycle of the loop, run under the cycle lock (BackgroundLoop::driven_cycle): its
  // Status, and through `in_flight` whether ops are left in flight after it.
  using Cycle = std::function<Status(bool* in_flight)>;

  // `enabled`: whether application threads may run cycles (see the Note); if not, the ops
  // get no driver and this object is only the communication thread's cycle lock.
  // `wake_loop` wakes the communication thread from its nap between cycles (TensorQueue::wake).
  LoopDriver(bool enabled, std::function<void()> wake_loop)
      : enabled_(enabled), wake_nap_(std::move(wake_loop)) {}
  bool enabled() const { return enabled_; }

  // ---- Application threads, from OpState::wait() (detail::Driver).
  void take_over() override;
  void drive() override TUTTI_EXCLUDES(mutex_);
  // Nothing: Handle::poll() never blocks, and a cycle may (a collective waits for its peers).
  void poll() override {}
  void let_go() override;
  void hand_back() override;

  // ---- The communication thread.
  // From now until detach(), drive() runs `cycle`.
  void attach(Cycle cycle) TUTTI_EXCLUDES(mutex_, sleep_mutex_);
  // The loop has ended: drive() does nothing from now on, nor does a hand-back wake anything.
  // Waits for a driven cycle under way.
  void detach() TUTTI_EXCLUDES(mutex_, sleep_mutex_);
  // The loop ends: no cycle is driven from now on. Called under the lock with the decision.
  void stop_driving() TUTTI_REQUIRES(mutex_) { cycle_ = nullptr; }
  // Held around each cycle the communication thread runs.
  detail::Mutex& cycle_mutex() TUTTI_RETURN_CAPABILITY(mutex_) { return mutex_; }
  // The first error a driven cycle returned (no cycle is driven after it); OK if none.
  const Status& failure() const TUTTI_REQUIRES(mutex_) { return failure_; }
  // Whether an application thread drives now. Any thread.
  bool driven() const { return drivers_.load(std::memory_order_acquire) > 0; }
  // Sleeps while an application thread drives, at most `timeout`.
  void sleep_while_driven(std::chrono::microseconds timeout) TUTTI_EXCLUDES(sleep_mutex_);

 private:
  // The communication thread should look again: a driver handed back, or let go with ops in
  // flight, or a driven cycle failed. Wakes it wherever it sleeps: in sleep_while_driven(), or
  // napping between cycles.
  void wake_loop() TUTTI_EXCLUDES(sleep_mutex_);

  const bool enabled_;
  const std::function<void()> wake_nap_;
  detail::Mutex mutex_;
  Cycle cycle_ TUTTI_GUARDED_BY(mutex_);  // Empty before attach() and after detach().
  Status failure_ TUTTI_GUARDED_BY(mutex_);
  std::atomic<int> drivers_{0};
  // Set by each driven cycle: ops were left in flight after it (let_go() then wakes the loop).
  std::atomic<bool> in_flight_{false};
  detail::Mutex sleep_mutex_;
  detail::CondVar looked_for_;  // sleep_while_driven() waits on it.
  // Between attach() and detach(): wake_nap_ reaches the session's queue only then (a thread
  // still waiting may hand back after the session is gone).
  bool attached_ TUTTI_GUARDED_BY(sleep_mutex_) = false;
};

}  // namespace tutti::core
