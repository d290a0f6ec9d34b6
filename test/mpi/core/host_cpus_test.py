# SPDX-License-Identifier: Apache-2.0
# Usage: host_cpus_test.py MPIEXEC PROGRAM
# A job confined by a cgroup to fewer CPUs than the machine has online counts only those
# (Note [The host's CPUs] in src/base/host_cpus.h): one rank alone on a machine of 2 or more
# CPUs does not fill its cores, but in a cpuset of 1 CPU, or under a quota of 1 CPU, it does:
# tutti::cores_shared() is true there and the default gradient grouping is one group. Needs
# root and a writable cgroup file system (v1's cpuset and cpu hierarchies, or v2 with the
# cpuset and cpu controllers); elsewhere it exits 77 (SKIP) saying why.
import os
import re
import subprocess
import sys

SKIP = 77
CGROUP = "/sys/fs/cgroup"


def skip(why):
    print(f"host_cpus_test: SKIP: {why}", flush=True)
    sys.exit(SKIP)


def decided(argv, cgroup_procs=None):
    """The program's line under `argv`, run in the cgroups whose process files are
    `cgroup_procs` (a shell moves itself there, then runs the job)."""
    move = "".join(f"echo $$ > {path} && " for path in cgroup_procs or [])
    run = subprocess.run(["sh", "-c", move + 'exec "$@"', "sh"] + argv, capture_output=True,
                         text=True, timeout=90, check=False)
    print(run.stdout + run.stderr, flush=True)
    found = re.search(r"cores_shared=(\d) default_gradient_groups=(\d)", run.stdout)
    if run.returncode != 0 or not found:
        print(f"host_cpus_test: FAIL: {' '.join(argv)} exited {run.returncode}", flush=True)
        sys.exit(1)
    return int(found.group(1)), int(found.group(2))


def first_allowed_cpu():
    return min(os.sched_getaffinity(0))


def make_v1(name):
    """A cpuset of one CPU and a cpu cgroup with a quota of one CPU, under v1's hierarchies:
    their process files, and the directories to remove."""
    cpuset = os.path.join(CGROUP, "cpuset", name)
    cpu_root = next((os.path.join(CGROUP, d) for d in ("cpu", "cpu,cpuacct")
                     if os.path.exists(os.path.join(CGROUP, d, "cpu.cfs_quota_us"))), None)
    if cpu_root is None:
        skip("no cgroup v1 cpu hierarchy")
    cpu = os.path.join(cpu_root, name)
    os.mkdir(cpuset)
    os.mkdir(cpu)
    with open(os.path.join(CGROUP, "cpuset", "cpuset.mems"), encoding="utf-8") as mems:
        write(os.path.join(cpuset, "cpuset.mems"), mems.read())
    write(os.path.join(cpuset, "cpuset.cpus"), str(first_allowed_cpu()))
    write(os.path.join(cpu, "cpu.cfs_period_us"), "100000")
    write(os.path.join(cpu, "cpu.cfs_quota_us"), "100000")
    return os.path.join(cpuset, "tasks"), os.path.join(cpu, "tasks"), [cpuset, cpu]


def make_v2(name):
    controllers = open(os.path.join(CGROUP, "cgroup.subtree_control"), encoding="utf-8").read()
    if "cpuset" not in controllers.split() or "cpu" not in controllers.split():
        skip("cgroup v2 without the cpuset and cpu controllers enabled for children")
    cpuset = os.path.join(CGROUP, name + "_cpuset")
    cpu = os.path.join(CGROUP, name + "_cpu")
    os.mkdir(cpuset)
    os.mkdir(cpu)
    write(os.path.join(cpuset, "cpuset.cpus"), str(first_allowed_cpu()))
    write(os.path.join(cpu, "cpu.max"), "100000 100000")
    return (os.path.join(cpuset, "cgroup.procs"), os.path.join(cpu, "cgroup.procs"),
            [cpuset, cpu])


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    mpiexec, program = sys.argv[1], sys.argv[2]
    if os.geteuid() != 0:
        skip("needs root (cgroups)")
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        skip("needs 2 or more CPUs (one rank already fills a machine of one)")
    job = [mpiexec, "-n", "1", program]
    # Unconfined, one rank has CPUs to spare.
    if decided(job) != (0, 0):
        print("host_cpus_test: FAIL: one rank on several CPUs counted as filling them",
              flush=True)
        return 1
    name = f"tutti_host_cpus_{os.getpid()}"
    v2 = os.path.exists(os.path.join(CGROUP, "cgroup.controllers"))
    try:
        cpuset_procs, cpu_procs, dirs = make_v2(name) if v2 else make_v1(name)
    except OSError as error:
        skip(f"cannot make cgroups here: {error}")
    failures = []
    try:
        for what, procs in (("a cpuset of 1 CPU", cpuset_procs), ("a quota of 1 CPU", cpu_procs)):
            if decided(job, [procs]) != (1, 1):
                failures.append(f"one rank in {what} did not count as filling its cores")
    finally:
        for d in dirs:
            try:
                os.rmdir(d)
            except OSError as error:
                print(f"host_cpus_test: could not remove {d}: {error}", flush=True)
    for failure in failures:
        print("host_cpus_test: FAIL:", failure, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
