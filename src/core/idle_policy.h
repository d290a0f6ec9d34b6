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
// backward() on machines without spare cores.
inline constexpr std::chrono::microseconds kSpinTime{50};
inline constexpr std::chrono::microseconds kBusyCap{200};
inline constexpr std::chrono::microseconds kIdleCap{10000};
// Point-to-point ops in flight: poll this long after the last progress (ping-pong latency).
inline constexpr std::chrono::microseconds kP2PSpinTime{2000};
// The shortest nap.
inline constexpr std::chrono::microseconds kMinNap{10};

// What the loop knows after a cycle that did no work.
struct IdleFacts {
  // Since the last cycle that did work, the loop's or a driver's.
  std::chrono::microseconds idle{0};
  bool app_waiting = false;  // An application thread is in OpState::wait().
  bool receiving = false;    // The control plane holds a message partly received.
  bool p2p_busy = false;     // Point-to-point ops are in flight.
  bool queue_empty = true;   // No collective is in flight (TensorQueue::empty()).
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
