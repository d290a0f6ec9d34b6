// SPDX-License-Identifier: Apache-2.0
#include "src/core/cpu_sharing.h"

#include <sched.h>

#include <thread>

namespace tutti::core {

CpuSharing decide_cpu_sharing(int allowed_cpus, unsigned host_cpus, const ops::Topology& topology,
                              bool comm_thread_pinned) {
  const bool ranks_exceed_cpus =
      host_cpus != 0 && static_cast<unsigned>(topology.local_size) > host_cpus;
  const std::chrono::nanoseconds spin_unless_crowded =
      ranks_exceed_cpus ? std::chrono::nanoseconds{0} : kLockSpin;
  if (comm_thread_pinned)
    return CpuSharing{.ranks_exceed_cpus = ranks_exceed_cpus, .lock_spin = spin_unless_crowded};
  // One CPU for the process: mpirun binds each of a few ranks to a core. Or as many ranks on
  // the host as CPUs (cores_shared, the same on every rank).
  const bool shares = allowed_cpus == 1 || topology.cores_shared;
  return CpuSharing{.shares_cpu = shares,
                    .ranks_exceed_cpus = ranks_exceed_cpus,
                    .lock_spin = shares ? std::chrono::nanoseconds{0} : spin_unless_crowded};
}

CpuSharing this_process_cpu_sharing(const ops::Topology& topology, bool comm_thread_pinned) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int count = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  // Online CPUs, not the cgroup's limit: see Note [The host's CPUs] in src/base/host_cpus.h.
  return decide_cpu_sharing(count, std::thread::hardware_concurrency(), topology,
                            comm_thread_pinned);
}

}  // namespace tutti::core
