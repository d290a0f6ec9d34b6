// SPDX-License-Identifier: Apache-2.0
// decide_cpu_sharing(): when a rank's threads count as sharing a CPU (Note [Waiting on a shared
// CPU] in background_loop.h), from the facts a session sees at its start.
#include "src/core/cpu_sharing.h"

#include <catch2/catch.hpp>

namespace tutti::core {
namespace {

ops::Topology host(int local_size, bool cores_shared) {
  ops::Topology topology;
  topology.size = local_size;
  topology.local_size = local_size;
  topology.cores_shared = cores_shared;
  return topology;
}

TEST_CASE("A rank bound to one core shares it", "[sharing]") {
  // mpirun -n 2 on a 16-core host binds each rank to a core.
  const CpuSharing sharing = decide_cpu_sharing(1, 16, host(2, false), false);
  CHECK(sharing.shares_cpu);
  CHECK_FALSE(sharing.ranks_exceed_cpus);
  // The queue's lock holder may be this CPU's other thread: no spinning on it.
  CHECK(sharing.lock_spin.count() == 0);
}

TEST_CASE("A rank free to run on several of many CPUs shares none", "[sharing]") {
  const CpuSharing sharing = decide_cpu_sharing(16, 16, host(2, false), false);
  CHECK_FALSE(sharing.shares_cpu);
  // The threads run on CPUs of their own: a contended lock spins before sleeping.
  CHECK(sharing.lock_spin == kLockSpin);
  CHECK(kLockSpin.count() > 0);
}

TEST_CASE("As many ranks as CPUs share them; more ranks than CPUs exceed them", "[sharing]") {
  const CpuSharing even = decide_cpu_sharing(2, 2, host(2, true), false);
  CHECK(even.shares_cpu);
  CHECK_FALSE(even.ranks_exceed_cpus);
  const CpuSharing over = decide_cpu_sharing(2, 2, host(4, true), false);
  CHECK(over.shares_cpu);
  CHECK(over.ranks_exceed_cpus);
  CHECK(even.lock_spin.count() == 0);
  CHECK(over.lock_spin.count() == 0);
  // Unknown CPU counts decide nothing by themselves.
  const CpuSharing unknown = decide_cpu_sharing(0, 0, host(4, false), false);
  CHECK_FALSE(unknown.shares_cpu);
  CHECK(unknown.lock_spin == kLockSpin);
}

TEST_CASE("A communication thread pinned by TUTTI_THREAD_AFFINITY has a CPU of its own",
          "[sharing]") {
  const CpuSharing sharing = decide_cpu_sharing(1, 2, host(4, true), true);
  CHECK_FALSE(sharing.shares_cpu);
  // Pinned or not, four ranks on two CPUs are too many to spin.
  CHECK(sharing.ranks_exceed_cpus);
  CHECK(sharing.lock_spin.count() == 0);
  // Two ranks on 16 CPUs, each communication thread pinned to a CPU of its own.
  CHECK(decide_cpu_sharing(1, 16, host(2, false), true).lock_spin == kLockSpin);
}

}  // namespace
}  // namespace tutti::core
