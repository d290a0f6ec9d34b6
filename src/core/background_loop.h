// SPDX-License-Identifier: Apache-2.0
// The communication thread's loop: the cycle that moves ops through the stages.
//
// Note [Threading model]
// A session's threads, and what each may touch:
//  - application threads call the public API: they validate arguments, read the process-set
//    table, push entries on the TensorQueue and wait on handles. A thread that waits may run
//    the point-to-point stage's step under its lock (Note [A waiting thread drives
//    point-to-point] in execution/p2p_engine.h), and, where MPI allows it and no device is
//    used, the whole cycle under the cycle lock (Note [A waiting thread runs the cycle] in
//    loop_driver.h).
//  - "tutti-comm", the communication thread (one per session, started by Session::create,
//    joined by Session::stop): runs the cycle, so makes every MPI and NCCL call of the
//    collectives that no waiting thread makes, and owns the stages below, the backends and the
//    movers. It holds the cycle lock around each cycle, so the stages belong to whichever
//    thread holds that lock; what it does between cycles (the idle policy, the stop request,
//    the shutdown handshake) is its own.
//  - "tutti-device" (CUDA ops only; DeviceCompletions): polls device events and completes
//    device ops through the Completer.
//  - "tutti-timeline" (while a timeline is open): writes the file; the others only format
//    events into its buffer.
// Shared state is guarded by annotated locks (TUTTI_GUARDED_BY, checked by the clang build in
// scripts/test): the queue, the process-set table's membership, each OpState, the device
// completions and the timeline. Everything else belongs to one thread.
//
// Note [The cycle]
// Data flows one way through three stages, each with its own state:
//   application --push--> TensorQueue
//     1. RequestSender (every rank): drains new entries, turns them into one RequestList
//        (cache ids where the cache knows the request) for the coordinator.
//     2. CoordinatorStage (rank 0): files every rank's lists, decides which ops are ready (or
//        wrong, or stalled), emits ResponseLists.
//     3. ResponseExecutor (every rank): runs each ResponseList in order: cache -> work ->
//        fusion plan -> executor -> Completer.
//   Beside them, point-to-point ops skip negotiation: P2PQueue --> P2PEngine --> Completer,
//   stepped once per cycle unless a waiting application thread steps it (Notes [P2P stage]
//   and [A waiting thread drives point-to-point] in p2p_engine.h). While any is in flight the
//   loop keeps polling instead of sleeping (a peer's message may come any moment): for
//   kP2PSpinTime after the last progress, and however long an application thread waits,
//   since MPI moves a large message only while it is polled and says nothing until the whole
//   message is through.
//   Completer --> the application's Handle.
// On rank 0, stage 1 hands its list to stage 2 and stage 2 its lists to stage 3 directly;
// everywhere else they travel over the control plane. One cycle: run the device checks,
// receive messages (ResponseLists, or on rank 0 RequestLists), send this rank's new requests,
// and on rank 0 emit the next ResponseList. When a cycle finds nothing to do the thread polls
// on briefly, then sleeps on the queue with a timeout that grows with idleness (idle_policy.h).
//
// Note [Waiting on a shared CPU]
// While an application thread waits on an op, the communication thread polls for kSpinTime
// after the last progress. Where the two have CPUs of their own, the waiting thread spins too
// (20 us, OpState::wait()). Where they share a CPU (mpirun binds each of a few ranks to one
// core; as many ranks as cores), that spin only took turns with the thread it waits for, each
// turn a system call and a context switch: the lone small allreduce (P2, 2 ranks each bound to
// a core of the 2-core AMD EPYC VM, four alternated runs) took 14.7-18.6 us with it, 8.1-9.5
// without. So there the waiting thread sleeps at once, and the op's completion wakes it.
// The loop yields between its polls all the same, though there it mostly finds nobody else to
// run: the thread it woke, or the device thread (Note [Device completion]), may need the CPU,
// and a woken thread cannot be counted on to preempt a running one. For a while the loop did
// not yield there, and on Linux 6.18 (the 2-core AMD EPYC VM) `perf sched timehist` showed the
// woken waiter getting its CPU for 3 us at a time between the loop's 60 us polls: each op's
// waiter waited out the rest of kSpinTime. Where waiting threads run no cycles (a process that
// sees a GPU, its CPU ops too; MPI without MPI_THREAD_MULTIPLE) that was every op's latency: a
// lone 1-float allreduce at 1 rank bound to a core took 71-79 us (a lone CUDA one 75.5 us on
// the H200, by inference the same cause), 4.8-5.1 us with the yield; at 2 ranks 74-76 us,
// 14.8-15.2 us with it. Where they do run cycles, the waiter of an op that outlasts a driver's
// 200 us sleeps, and met the same delay.
//
// Note [Shutdown handshake]
// Every rank sends the coordinator exactly one RequestList with `shutdown` set per session,
// and it is the rank's last message: when stop() is called, when its loop fails (carrying the
// error, so the coordinator can stop the others instead of leaving them waiting), or, if the
// coordinator's bye came first, as its acknowledgement. The coordinator, once any rank stopped
// or a stall passed its limit, sends every rank one last ResponseList, the bye, carrying the
// reason; then it keeps receiving until it has the last message of every rank (at most
// kShutdownAnswerTimeout). So no message of a session is left unreceived when its
// communicators are freed: OpenMPI reuses a freed communicator's context, and a stray message
// would reach the next session. The bye says whether its reason is an error (a stall, a fault,
// a rank that stopped on one) or only shutdown() calls: only after an error may a peer be stuck,
// so only then are the communicators left to MPI_Finalize instead of being freed collectively,
// and MPI_Finalize bounded by TUTTI_EXIT_GRACE_SECONDS (Session::finish).
#pragma once

#include <atomic>
#include <chrono>
#include <optional>

#include "ops/control_plane.h"
#include "src/common/status.h"
#include "src/core/completer.h"
#include "src/core/config.h"
#include "src/core/cpu_sharing.h"
#include "src/core/execution/device_path.h"
#include "src/core/execution/p2p_engine.h"
#include "src/core/execution/response_executor.h"
#include "src/core/idle_policy.h"
#include "src/core/loop_driver.h"
#include "src/core/negotiation/coordinator_stage.h"
#include "src/core/negotiation/request_sender.h"
#include "src/core/process_set_table.h"
#include "src/core/tensor_queue.h"
#include "src/core/timeline.h"
#include "src/core/tuning/autotune.h"

namespace tutti::core {

// Communication thread only (built by Session::create before the thread starts), except the
// cycles a waiting thread runs through Parts::driver.
class BackgroundLoop {
 public:
  // Everything the loop works with; all of it must outlive the loop.
  struct Parts {
    ops::ControlPlane& plane;
    TensorQueue& queue;
    ProcessSetTable& sets;
    DevicePath& device;
    P2PEngine& p2p;  // Point-to-point ops: Note [P2P stage] in p2p_engine.h.
    // Its cycle lock, and the waiting threads that run cycles (Note [A waiting thread runs the
    // cycle] in loop_driver.h).
    LoopDriver& driver;
    const Completer& completer;
    Timeline& timeline;
    FlightRecorder& recorder;
    const Config& config;
    CpuSharing sharing;  // Note [Waiting on a shared CPU].
  };
  explicit BackgroundLoop(Parts parts);

  // Runs cycles until the job stops, then ends the shutdown handshake. `stop_requested` is
  // set by Session::stop(). Returns OK when the job stopped on request, or the error that
  // stopped this rank.
  Status run(const std::atomic<bool>& stop_requested);
  // Why the job stopped, as the coordinator's bye said (the status pending ops fail with);
  // nothing if no bye arrived.
  const std::optional<Status>& shutdown_reason() const { return executor_.shutdown(); }
  // Whether that reason was an error rather than every rank's shutdown().
  bool stopped_after_error() const { return executor_.shutdown_after_error(); }
  const CpuSharing& sharing() const { return parts_.sharing; }

 private:
  bool is_coordinator() const { return coordinator_.has_value(); }
  // One cycle; *did_work tells the idle policy whether anything moved.
  Status cycle(bool* did_work) TUTTI_REQUIRES(parts_.driver.cycle_mutex());
  // One cycle on an application thread (LoopDriver::drive()); *in_flight: whether ops are left
  // in flight after it.
  Status driven_cycle(bool* in_flight) TUTTI_REQUIRES(parts_.driver.cycle_mutex());
  // The loop's body until the job stops, each cycle under the cycle lock.
  Status run_cycles(const std::atomic<bool>& stop_requested);
  // One step of the loop: the stop request, or a cycle and the idle policy after it (into
  // *pause, what the loop does outside the cycle lock before the next step). Returns how the loop
  // ends (OK: the job stopped), or nothing to go on.
  std::optional<Status> step(const std::atomic<bool>& stop_requested, Pause* pause)
      TUTTI_REQUIRES(parts_.driver.cycle_mutex());
  // Whether no message this rank may be sent needs a look within kIdleCap (Note [Quiet naps]
  // in idle_policy.h).
  bool messages_may_wait() const TUTTI_REQUIRES(parts_.driver.cycle_mutex());
  // A rank other than the coordinator: sends it `list`, then rings its net bell where that may
  // end a nap the list would wait out (Note [Net bell] in ops/mpi/net_bell.h).
  Status send_to_coordinator(const RequestList& list);
  Status receive(bool* did_work);
  Status send_new(bool* did_work);
  // Rank 0: sends `list` to every other rank, then executes it here. With autotune, the list
  // first carries the tuner's new settings, if it has any (Note [Autotune] in autotune.h).
  Status broadcast_and_execute(ResponseList list);
  // The cycle time autotune sent with `list`, if any (Note [Autotune] in autotune.h).
  void adopt_cycle_time(const ResponseList& list);
  // This rank stops, for `why` (OK: stop() was called).
  Status stop_here(const Status& why);
  // See Note [Shutdown handshake].
  Status finish_handshake();

  Parts parts_;
  const int rank_;
  ResponseExecutor executor_;
  RequestSender sender_;                         // Reads executor_'s cache.
  std::optional<CoordinatorStage> coordinator_;  // Rank 0 only.
  std::optional<Autotuner> tuner_;               // Rank 0 with TUTTI_AUTOTUNE=1 only.
  // When a cycle, the loop's or a driver's, last did work: the idle policy's clock.
  std::chrono::steady_clock::time_point last_work_ TUTTI_GUARDED_BY(parts_.driver.cycle_mutex()) =
      std::chrono::steady_clock::now();
};

}  // namespace tutti::core
