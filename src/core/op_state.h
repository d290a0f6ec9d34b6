// SPDX-License-Identifier: Apache-2.0
// The state a Handle shares with the runtime: done flag, final Status, results.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/common/status.h"
#include "tutti/collectives.h"
#include "tutti/tensor.h"

namespace tutti::core {
class Completer;
}

namespace tutti::detail {

// Progress that a thread waiting on an op may make itself rather than wait for the thread that
// runs the op (Notes [A waiting thread drives point-to-point] in execution/p2p_engine.h and [A
// waiting thread runs the cycle] in loop_driver.h).
// A waiting thread calls take_over(), then drive() until its op is done or its time is up,
// then let_go() or hand_back(). Any thread.
class Driver {
 public:
  virtual ~Driver() = default;
  // The thread starts driving.
  virtual void take_over() {}
  // Makes what progress it can, or nothing if another thread is at it.
  virtual void drive() = 0;
  // Handle::poll()'s step, which must not block: drive() unless the driver says otherwise.
  virtual void poll() { drive(); }
  // The thread's op is done: it stops driving and goes on.
  virtual void let_go() {}
  // The thread stops driving and sleeps: the op's own thread takes it on at once.
  virtual void hand_back() = 0;
};

// Which of the running session's drivers a thread waiting on an op may drive it with: none, the
// loop's (Note [A waiting thread runs the cycle]) or the point-to-point engine's.
enum class DriverKind : std::uint8_t { None, Loop, PointToPoint };

// The running session's drivers, which ops find by their DriverKind when a thread waits on one
// that is not done (Note [Drivers by kind] in op_state.cc). Set by the session as it starts.
// Any thread.
void set_drivers(std::weak_ptr<Driver> loop, std::weak_ptr<Driver> point_to_point);

// What an op produced besides its Status.
struct OpResults {
  Tensor output;                              // allgather, alltoall, reducescatter
  std::vector<Tensor> outputs;                // grouped allgather / reducescatter
  std::vector<std::int64_t> received_splits;  // alltoall
  int last_joined_rank = -1;                  // join(): the global rank that joined last
  int created_set_id = -1;                    // add_process_set(): the new set's id
  int source = -1;                            // irecv: the sender's global rank

  // An op of one result tensor: `output`, and `outputs` holding it (a grouped op's Handle
  // reads the latter).
  void set_output(const Tensor& tensor) {
    output = tensor;
    outputs = {tensor};
  }
};

// Results are written by the thread that runs the op (the communication thread, or for device
// ops the device thread) before it completes the op, and read by any thread after done() or
// wait() said so; the release store of `done_` orders the two.
class OpState {
 public:
  bool done() const { return done_.load(std::memory_order_acquire) != 0; }
  // done(), after one step of the op's driver if it has one (as MPI_Test makes progress:
  // Driver::poll()). Never blocks. Any thread.
  bool poll() const;
  // Any thread. Blocks until the op is complete; returns its Status.
  Status wait() const;
  // Runs the op's driver, if it has one, until the op is done or `time` has passed, then lets
  // it go either way: for a thread that goes on with other work after (Note [A submitting
  // thread keeps its backlog short] in submission_window.h). Returns done(). Any thread.
  bool drive_for(std::chrono::microseconds time) const;
  // wait() and drive_for() read the clock once every this many steps of the driver: up to
  // kStepsPerClockRead - 1 steps may run past their time.
  static constexpr unsigned kStepsPerClockRead = 8;

  // The op's results, or an empty OpResults if it produced none. Read after done().
  const OpResults& results() const { return results_ ? *results_ : kNoResults; }
  // The results to write, made on first use. Only the thread that runs the op, before it
  // completes the op.
  OpResults& mutable_results() {
    if (!results_) results_ = std::make_unique<OpResults>();
    return *results_;
  }
  // Set at submission, before any thread can wait on the op, if a waiting thread may drive it
  // (Note [A waiting thread drives point-to-point] in execution/p2p_engine.h).
  DriverKind driver = DriverKind::None;

 private:
  friend class core::Completer;  // The one place ops are completed (Note [Completion]).
  void complete(Status status);
  // Steps `by` until the op is done or `until`; the caller has taken it over. The clock is read
  // every kStepsPerClockRead steps, so up to kStepsPerClockRead - 1 steps may run past `until`.
  void drive_until(Driver& by, std::chrono::steady_clock::time_point until) const;

  // 1 once complete. An int, not a bool: a sleeper waits on it with C++20's atomic wait, which
  // for a 4-byte atomic is a futex on the atomic itself. No mutex or condition variable: every
  // op carries an OpState, and those 88 bytes were an eighth of an op's memory (an op's record
  // is read cold, tens of thousands of ops later, where a step submits that many: P3).
  std::atomic<int> done_{0};
  // Threads asleep (or about to sleep) in wait(): complete() wakes only when there are some, so
  // that completing the thousands of ops nobody waits for yet (a step's gradients, waited for
  // later) costs two atomic operations each. See complete().
  mutable std::atomic<int> sleepers_{0};
  Status status_;  // Written once before done_ is set; read after.
  // On the heap, made by mutable_results(): most ops (allreduce, broadcast) produce none, and
  // inline it would be 136 bytes more in every op's record.
  std::unique_ptr<OpResults> results_;
  static const OpResults kNoResults;
};

// Application threads inside OpState::wait() right now, over the whole process: while none
// is, the communication thread does not spin between cycles, so that it yields the core to the
// application's computation (an overlapped backward pass); see Note [The cycle]. Any thread.
bool app_threads_waiting();
// Whether OpState::wait() spins briefly before it sleeps: true (the default) where the
// communication thread has a CPU of its own, false where it shares one with the application's
// threads (Note [Waiting on a shared CPU] in background_loop.h). Set by the session at start,
// for the whole process. Any thread.
void set_wait_spins(bool spins);

// The back door from core into Handle, whose constructor from an OpState is private.
struct HandleAccess {
  static Handle make(std::shared_ptr<OpState> state) { return Handle(std::move(state)); }
};

// Core's way into TensorView, for the views an op keeps (Note [Views kept without their
// shapes] in tensor_queue.h).
struct TensorViewAccess {
  // Frees `view`'s shape (an empty one remains); its data, dtype, device and element count
  // stay as they were.
  static void drop_shape(TensorView& view) { Shape().swap(view.shape_); }
};

}  // namespace tutti::detail
