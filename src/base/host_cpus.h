// SPDX-License-Identifier: Apache-2.0
// host_cpus(): the CPUs this host gives the job, which decide whether its ranks fill the host's
// cores (Topology::cores_shared: tutti::cores_shared(), the default gradient grouping, and
// whether a rank's threads count as sharing a CPU, CpuSharing::shares_cpu).
//
// Note [The host's CPUs]
// std::thread::hardware_concurrency() counts the machine's online CPUs. A container limited to
// some of them still sees all of them there: by a cpuset (docker --cpuset-cpus, Kubernetes'
// static CPU manager, Slurm's task cgroups) or by a CPU quota (docker --cpus, a Kubernetes CPU
// limit, the usual way). Two ranks in a container of 2 CPUs on a 64-CPU machine were taken for
// ranks with CPUs to spare: one allreduce per gradient where one group is what pays, and
// threads spinning on a CPU their own other thread needed. A rank's own affinity does not tell
// either: mpirun binds each rank to one core of the set. The cgroup does: the CPUs of this
// process's cpuset (cgroup v2's cpuset.cpus.effective, v1's cpuset.effective_cpus) and its CPU
// quota over its period (v2's cpu.max, v1's cpu.cfs_quota_us and cpu.cfs_period_us), the
// smallest quota on the path from its cgroup up to the hierarchy's root, since each of them
// applies. A quota of 1.5 CPUs counts as 2: the ranks can use both, half the time. Files that
// are missing or unreadable limit nothing, so a machine without cgroups counts its online CPUs,
// as before.
//
// The modes for more ranks than CPUs (CpuSharing::ranks_exceed_cpus: no waiting thread drives
// MPI; BackendOptions::host_oversubscribed: the shared-memory ring's) still count online CPUs.
// Switched on for 2 ranks in a cpuset of 1 CPU of the 2-core AMD EPYC VM (family 25 model 17),
// they made every figure worse than the modes for spare CPUs: the lone allreduce (P2) took 64.7
// µs against 25.1-25.7, P1 38.2-39.9 ms against 28.6-29.7, P3 8.4-15.9 ms against 6.1-6.5 (two
// alternated pairs, `allreduce_benchmark --repeats 3`). Where those modes pay is not measured
// beyond the case they were made for (4 ranks on that VM's 2 CPUs).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tutti::base {

// The CPUs of a cpuset list as the kernel writes it ("0-3,8,10-11\n": 7); nullopt for text
// that is not one (empty, a descending range, anything but digits, ',', '-' and whitespace).
std::optional<int> count_cpu_list(std::string_view list);

// A CPU quota in CPUs, from cgroup v2's cpu.max ("150000 100000": 1.5); nullopt for no quota
// ("max 100000") or text that is not one.
std::optional<double> quota_of_cpu_max(std::string_view text);

// The same from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us ("-1": no quota).
std::optional<double> quota_of_cfs(std::string_view quota_us, std::string_view period_us);

// What the cgroups of a process limit its CPUs to.
struct CgroupCpuLimit {
  std::optional<int> cpuset;    // CPUs in its cpuset.
  std::optional<double> quota;  // Its smallest CPU quota, in CPUs.
};

// The limits of this process's cgroups, read from `root`/proc/self/{cgroup,mountinfo} and the
// cgroup files they point to under `root` (tests pass a directory laid out like /; "" reads
// the real files). See Note [The host's CPUs].
CgroupCpuLimit read_cgroup_cpu_limit(const std::string& root = "");

// `online` CPUs (0: unknown) as `limit` leaves them: the smallest of the online CPUs, the
// cpuset's and the quota rounded up, at least 1; 0 when none of them is known.
unsigned host_cpus_within(unsigned online, const CgroupCpuLimit& limit);

// This host's CPUs for this process's job: the online CPUs within its cgroups' limits. What
// Topology::cores_shared counts; see the Note for what does not.
unsigned host_cpus();

}  // namespace tutti::base
