// SPDX-License-Identifier: Apache-2.0
// A caller waiting in rpc_sync() runs the RPC thread's pass itself.
//
// Note [A waiting caller runs the pass]
// An empty rpc_sync() crossed four threads (P7): the caller handed its frame to its RPC thread,
// the callee's RPC thread handed the request to a pool thread and the pool thread the response
// back, and the caller's RPC thread completed the future, waking the caller. Where a rank's
// threads share a CPU every hand-off is a wake-up and a context switch, and those, not MPI, made
// up most of the round trip. So, as a thread waiting for a collective runs the communication
// thread's cycle (Note [A waiting thread runs the cycle] in src/core/loop_driver.h), a thread in
// call_sync() runs the RPC thread's pass itself while it waits, for up to kDriveWindow: it
// queues its frame without waking the RPC thread, and sends it, polls, and completes its own
// future from the response on its own thread. The caller's two hand-offs go.
//  - The pass's state (the loopback queue, the reassembler, the counts and the shutdown
//    handshake's) belongs to whoever holds pass_mutex_: the RPC thread around each of its
//    passes, a driving caller around each of its own (drive_once(), which yields instead when
//    the lock is taken: the holder may need this CPU to finish). Frames are processed in
//    arrival order either way, so the RRef protocol's ordering holds.
//  - While drivers_ > 0 the RPC thread sleeps (sleep_while_driven()) and runs one pass each
//    kMaxSleep, so that callers driving one after another cannot keep it from a shutdown
//    request. Only it runs the shutdown handshake's steps and the expiry of calls nobody waits
//    for (a driving caller's own deadline is checked by its future).
//  - A driver that lets go wakes the RPC thread only if work is left (its call not done, frames
//    queued, a transfer under way), so a lone call costs no wake-up at all; one that stops
//    because the loop ended, or its pass failed (the fault goes to run(), which ends the loop on
//    it), falls back to waiting on its future, which the loop's teardown completes.
//  - A pass runs handlers and callbacks, which must not block; a call_sync() from inside a pass
//    (in_pass_) does not drive: it cannot take the lock it holds.
// Driving makes the RPC thread's MPI calls from the caller's thread, which needs
// MPI_THREAD_MULTIPLE (init_rpc() requires it anyway), and it spins, so not where ranks
// outnumber the host's CPUs (AgentOptions::callers_drive, from the session's rule for
// collectives).
#include <thread>
#include <utility>

#include "src/rpc/agent.h"

namespace tutti::rpc::detail {
namespace {

// How long a caller drives before it sleeps on its future: a small call's round trip on a
// loaded host; longer calls are the RPC thread's, as before.
constexpr std::chrono::microseconds kDriveWindow{200};

}  // namespace

std::shared_ptr<FutureState> Agent::call_sync(int to, std::string function, Message args,
                                              Clock::duration timeout, std::int64_t context_id) {
  if (!options_.callers_drive || in_pass_) {
    std::shared_ptr<FutureState> future =
        call(to, std::move(function), std::move(args), timeout, context_id);
    future->wait();
    return future;
  }
  drivers_.fetch_add(1, std::memory_order_acq_rel);
  std::shared_ptr<FutureState> future =
      submit_call(to, std::move(function), std::move(args), timeout, context_id, {}, {},
                  /*notify=*/false);
  const Clock::time_point until = Clock::now() + kDriveWindow;
  bool done = future->done();
  while (!done && drive_once() && Clock::now() < until) done = future->done();
  drivers_.fetch_sub(1, std::memory_order_acq_rel);
  bool work_left = !done || driven_left_work_.load(std::memory_order_relaxed);
  if (!work_left) {
    const tutti::detail::MutexLock lock(queue_mutex_);
    work_left = !outgoing_.empty();
  }
  if (work_left) wake();
  future->wait();
  return future;
}

bool Agent::drive_once() {
  if (!pass_mutex_.try_lock()) {
    std::this_thread::yield();
    return true;
  }
  bool go_on = true;
  bool failed = false;
  if (loop_ended_ || !driven_fatal_.ok()) {
    go_on = false;
  } else {
    const AgentScope scope(this);  // Handlers may ask for their agent, as on the RPC thread.
    in_pass_ = true;
    Status fatal;
    exchange(&fatal);
    in_pass_ = false;
    driven_passes_.fetch_add(1, std::memory_order_relaxed);
    if (!fatal.ok()) {
      driven_fatal_ = std::move(fatal);
      go_on = false;
      failed = true;
    }
    driven_left_work_.store(!plane_.sends_done() || plane_.receiving() || !loopback_.empty(),
                            std::memory_order_relaxed);
  }
  pass_mutex_.unlock();
  if (failed) wake();  // run() ends the loop on the fault.
  return go_on;
}

void Agent::sleep_while_driven() {
  const tutti::detail::MutexLock lock(queue_mutex_);
  const Clock::time_point until = Clock::now() + kMaxSleep;
  while (drivers_.load(std::memory_order_acquire) > 0 && !wake_ &&
         queue_cv_.wait_until(queue_mutex_, until)) {
  }
  wake_ = false;
}

}  // namespace tutti::rpc::detail
