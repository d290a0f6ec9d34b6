// SPDX-License-Identifier: Apache-2.0
// Whether a rank's communication thread shares a CPU with its application threads, and what
// the loop and the waiting threads do about it: Note [Waiting on a shared CPU] in
// background_loop.h, Note [Batching on a shared CPU] in negotiation/request_sender.cc.
#pragma once

#include <chrono>

#include "ops/transport.h"

namespace tutti::core {

// What a session decides once, at its start, from where its threads may run.
struct CpuSharing {
  // The application's threads run on the communication thread's CPU.
  bool shares_cpu = false;
  // The host runs more ranks than it has CPUs: a thread that spins keeps a CPU a peer needs.
  bool ranks_exceed_cpus = false;
  // How long a thread spins on the TensorQueue's lock held by another before sleeping on it
  // (Note [The queue's lock on spare CPUs] in tensor_queue.h): only where the application's
  // threads and the communication thread have CPUs of their own and no peer needs them.
  std::chrono::nanoseconds lock_spin{0};
};

// CpuSharing::lock_spin where spinning is allowed: longer than the queue's lock is usually
// held, and short against a sleep and a wake-up.
inline constexpr std::chrono::nanoseconds kLockSpin{20'000};

// `allowed_cpus`: the CPUs this process may run on (sched_getaffinity; 0 if unknown);
// `host_cpus`: the host's online CPUs (0 if unknown; Note [The host's CPUs] in
// src/base/host_cpus.h says why not within its cgroup's limits); `comm_thread_pinned`:
// TUTTI_THREAD_AFFINITY gives the communication thread a CPU of its own.
CpuSharing decide_cpu_sharing(int allowed_cpus, unsigned host_cpus, const ops::Topology& topology,
                              bool comm_thread_pinned);

// The same for this process, as it runs now.
CpuSharing this_process_cpu_sharing(const ops::Topology& topology, bool comm_thread_pinned);

}  // namespace tutti::core
