// SPDX-License-Identifier: Apache-2.0
// Whether a rank's communication thread shares a CPU with its application threads, and what
// the loop and the waiting threads do about it: Note [Waiting on a shared CPU] in
// background_loop.h, Note [Batching on a shared CPU] in negotiation/request_sender.cc.
#pragma once

#include "ops/transport.h"

namespace tutti::core {

// What a session decides once, at its start, from where its threads may run.
struct CpuSharing {
  // The application's threads run on the communication thread's CPU.
  bool shares_cpu = false;
  // While an application thread waits, the loop polls without yielding the CPU: it shares
  // one, and the host has no more ranks than CPUs (else the CPU it kept is one a peer needs).
  bool poll_without_yield = false;
  // The host runs more ranks than it has CPUs: a thread that spins keeps a CPU a peer needs.
  bool ranks_exceed_cpus = false;
};

// `allowed_cpus`: the CPUs this process may run on (sched_getaffinity; 0 if unknown);
// `host_cpus`: the host's online CPUs (0 if unknown); `comm_thread_pinned`: TUTTI_THREAD_AFFINITY
// gives the communication thread a CPU of its own.
CpuSharing decide_cpu_sharing(int allowed_cpus, unsigned host_cpus, const ops::Topology& topology,
                              bool comm_thread_pinned);

// The same for this process, as it runs now.
CpuSharing this_process_cpu_sharing(const ops::Topology& topology, bool comm_thread_pinned);

}  // namespace tutti::core
