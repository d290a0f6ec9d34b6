// SPDX-License-Identifier: Apache-2.0
// What the communication thread does between two of its cycles when the last one found no work:
// go on at once after a yield, or nap on the queue (Notes [The cycle] and [Waiting on a shared
// CPU] in background_loop.h).
#pragma once

#include <chrono>

namespace tutti::core {

// While an application thread waits on an op, poll this long after the last work (the answer
// it waits for may come any moment, and its core is idle anyway); otherwise, and after that,
// nap with a timeout that grows with the idle time up to a cap: short while ops are in
// flight, long when nothing is (an idle job then wakes ~100 times/s: each wake-up costs some
// 20 us of CPU on a VM, a context switch and a poll of MPI: P4 read 0.7-1.1 % on the 2-core
// AMD EPYC VM with a 5 ms cap, 0.4-0.5 % with this one). Not polling while nobody waits
// leaves the core to the application's computation: during an overlapped backward pass the
// hooks' submissions each wake this thread, and polling after each took the core from
// backward() on machines without spare cores. Where no message needs a prompt look the idle
// cap is longer still (Note [Quiet naps]).
inline constexpr std::chrono::microseconds kSpinTime{50};
inline constexpr std::chrono::microseconds kBusyCap{200};
inline constexpr std::chrono::microseconds kIdleCap{10000};
// Nothing in flight and no message due soon (IdleFacts::messages_may_wait): Note [Quiet naps].
inline constexpr std::chrono::microseconds kQuietCap{100000};
// Point-to-point ops in flight: poll this long after the last progress (ping-pong latency).
inline constexpr std::chrono::microseconds kP2PSpinTime{2000};
// The shortest nap.
inline constexpr std::chrono::microseconds kMinNap{10};

// Note [Quiet naps]
// kIdleCap bounds how long a message that no wake-up announces waits for the loop to look: MPI
// cannot end a nap. Once a rank's loop has nothing in flight, few messages still need such a
// look, and the loop knows when none does:
//  - a rank other than the coordinator is sent only the response lists of ops (its own, which
//    keep its queue busy, and other sets', which it only files and which can wait) and the
//    coordinator's bye, which may wait as well: no peer's op waits for its answer to a bye it
//    gets while idle. (After it has sent its own last message it waits for the bye: kIdleCap.)
//  - the coordinator is sent requests. It may wait only while it holds no op some rank has
//    submitted (its stall checks look at those on every cycle), and only where either
//    - every other rank rings its doorbell as it sends (one host, every rank mapped the
//      doorbell's page: Note [Doorbell] in ops/mpi/doorbell.h). A message that MPI hands over
//      only after its sender rang would wait out the nap, as that Note says; but the nap is
//      this long only after 0.8 s without a message, and each look drains what MPI has queued
//      for the coordinator, so a new message finds nothing ahead of it to hold it back; or
//    - it is a member of every process set, as in most jobs on several hosts (whose ranks
//      elsewhere ring only the net bell, whose datagrams may be lost: Note [Net bell] in
//      ops/mpi/net_bell.h). Then every op a request names waits for the coordinator's own
//      submission as well, which ends the nap, and the request is read on that look. What
//      waits out a nap is what no submission of its own follows: the requests of an op the
//      coordinator never submits (a stall, which its warning reports that much later), and a
//      rank's last message while the coordinator runs on, where the net bell's ring for it does
//      not arrive (after shutdown() or an error there, the job then stops up to 100 ms later
//      than before). With a set it is not in, requests from
//      ranks that do not ring the doorbell have no submission of its own to end the nap:
//      kIdleCap, and the net bell's ring, where it comes, ends the nap earlier.
// There the cap is kQuietCap, which the nap reaches after 0.8 s of idle (an eighth of it): an
// idle job's communication threads wake about 10 times a second instead of 100. On the 2-core
// AMD EPYC VM of family 25 model 1, 2 ranks bound to its cores, each thread of an idle job woke
// 492 times in 5 s with kIdleCap alone and 49-50 times with kQuietCap, and P4 (the idle
// runtime's CPU) read 0.074-0.241 % against 0.470-0.898 % (examples/BENCHMARK_LOG.md,
// twenty-eighth round). In a job on 2 hosts of scripts/netns_cluster, one rank each, the
// coordinator's thread woke 489-490 times in 5 s of idle before the second rule and 50 with it
// (its CPU 40-50 ms against 0), and a lone allreduce after 1.2 s of idle took 0.53-0.57 ms at
// the median against 0.48-0.54 before (twenty-ninth round). What gets slower is what only the
// loop's look completes: a point-to-point receive of up to 2 KB posted during such a nap, which no
// thread waits on or polls, completes up to 100 ms after its message came (Note [Waking the loop
// for point-to-point] in execution/p2p_engine.h); and a rank that idles when the job stops answers
// the coordinator's bye up to 100 ms later, which the coordinator's shutdown() waits for.

// What the loop knows after a cycle that did no work.
struct IdleFacts {
  // Since the last cycle that did work, the loop's or a driver's.
  std::chrono::microseconds idle{0};
  bool app_waiting = false;  // An application thread is in OpState::wait().
  bool receiving = false;    // The control plane holds a message partly received.
  bool p2p_busy = false;     // Point-to-point ops are in flight.
  bool queue_empty = true;   // No collective is in flight (TensorQueue::empty()).
  // No message this rank may be sent needs a look within kIdleCap (Note [Quiet naps]).
  bool messages_may_wait = false;
};

// Between two cycles: yield the CPU once, or nap on the queue up to `nap` (a submission ends
// it), or neither.
struct Pause {
  bool yield = false;
  std::chrono::microseconds nap{0};
  // The coordinator's nap, which ranks on its host end with a message (Note [Doorbell] in
  // ops/mpi/doorbell.h): ControlPlane::nap_ends() is due after it. Set by the loop, not here.
  bool rung = false;
};

// The loop's idle policy. Whenever it goes on polling, it yields between polls: a thread of
// this process may need its CPU (Note [Waiting on a shared CPU] in background_loop.h).
Pause idle_pause(const IdleFacts& facts);

}  // namespace tutti::core
