#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# Usage: cluster_test.py CASE ARGS...
#   layout SPEC [--hostfile] PROGRAM     rank-layout queries on SPEC's hosts (e.g. 3,1: 3 ranks
#                                        on tnode0, 1 on tnode1), launched with -H or a hostfile
#   sweep SPEC on|off|auto PROGRAM [ARGS]  an mpi-suite test program on SPEC's hosts,
#                                        hierarchical allreduce and allgather on, off or auto
#   fault link|crash|ranks PROGRAM       test/cluster/fault_program on 2 hosts x 2; after some
#                                        steps tnode1's link goes down, tnode1 crashes (every
#                                        process killed) or its ranks are killed: the job must end
#                                        within the README's bound, tuttirun naming tnode1
#   mnist PROGRAM [ARGS]                 examples/fashion_mnist on 1 host and on 2 hosts: the same
#                                        accuracy (see case_mnist)
#   p10 PROGRAM [ARGS]                   allreduce_benchmark --p10 on 2 hosts x 2 (prints P10)
#
# The cluster suite's driver (test/cluster/meson.build). Each case runs in a cluster of
# network namespaces built by scripts/netns_cluster (the script re-runs itself inside one), so
# it needs root; without root or network namespaces, or under an MPI other than Open MPI, it
# exits 77 (meson: SKIP) with the reason. Jobs are launched by scripts/tuttirun, as a user
# would. Environment: NETNS_CLUSTER and TUTTIRUN, the paths of those scripts.

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

NETNS_CLUSTER = os.environ.get("NETNS_CLUSTER", "scripts/netns_cluster")
TUTTIRUN = os.environ.get("TUTTIRUN", "scripts/tuttirun")
SKIP = 77
# The README's bounds ("Several hosts"): a job ends at most this long after a host's processes
# die, and at most this long after TUTTI_NETWORK_TIMEOUT once a host's link goes down.
CRASH_BOUND_S = 10.0
LINK_BOUND_EXTRA_S = 10.0
NETWORK_TIMEOUT_S = 6  # --network-timeout of the link test: short, to keep the suite short.
MNIST_HIERARCHICAL_TOLERANCE = 0.2  # Percentage points; see case_mnist.


def fail(message):
    print(f"cluster_test: FAIL: {message}", flush=True)
    sys.exit(1)


def hosts_of(spec):
    """'2,2' -> 'tnode0:2,tnode1:2' (netns_cluster's default host names)."""
    return ",".join(f"tnode{i}:{slots}" for i, slots in enumerate(spec.split(",")))


class Job:
    """A process started in a session of its own, its output collected by threads (and echoed,
    so that meson's log shows it)."""

    def __init__(self, argv, env=None):
        print("cluster_test: $ " + " ".join(argv), flush=True)
        self.started = time.monotonic()
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, errors="replace", env=env,
                                        start_new_session=True)
        self.out, self.err = [], []
        self.threads = [threading.Thread(target=self._read, args=(stream, lines, sink), daemon=True)
                        for stream, lines, sink in ((self.process.stdout, self.out, sys.stdout),
                                                    (self.process.stderr, self.err, sys.stderr))]
        for thread in self.threads:
            thread.start()

    @staticmethod
    def _read(stream, lines, sink):
        for line in stream:
            lines.append(line)
            sink.write(line)
            sink.flush()

    def wait(self, timeout):
        """The exit status, or a FAIL once `timeout` seconds passed (the job is killed)."""
        try:
            status = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # Our own session: the job we started.
            self.process.wait()
            fail(f"the job ran past {timeout} s")
        for thread in self.threads:
            thread.join(timeout=5)
        return status

    def wait_for_output(self, text, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in list(self.out)):
                return
            if self.process.poll() is not None:
                fail(f"the job ended (status {self.process.returncode}) before printing '{text}'")
            time.sleep(0.1)
        fail(f"no '{text}' within {timeout} s")


def tuttirun(args, timeout, env=None):
    job = Job([sys.executable, TUTTIRUN] + args, env)
    status = job.wait(timeout)
    return status, "".join(job.out), "".join(job.err)


def case_layout(args):
    spec, rest = args[0], args[1:]
    use_hostfile = rest and rest[0] == "--hostfile"
    program = rest[-1]
    hosts = hosts_of(spec)
    total = sum(int(slots) for slots in spec.split(","))
    if use_hostfile:
        hostfile = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
        hostfile.write("".join(f"{entry.split(':')[0]} slots={entry.split(':')[1]}\n"
                               for entry in hosts.split(",")))
        hostfile.close()
        where = ["--hostfile", hostfile.name]
    else:
        where = ["-H", hosts]
    status, out, _ = tuttirun(["-np", str(total)] + where + [program, hosts], timeout=120)
    if status != 0:
        fail(f"the layout job exited {status}")
    if len(re.findall(r": ok$", out, flags=re.MULTILINE)) != total:
        fail(f"not every one of the {total} ranks reported a right layout")


def case_sweep(args):
    spec, switch, command = args[0], args[1], args[2:]
    total = sum(int(slots) for slots in spec.split(","))
    # auto is the default: no flag, and none of the caller's variables either.
    flags = {"on": ["--hierarchical-allreduce", "--hierarchical-allgather"],
             "off": ["--no-hierarchical-allreduce", "--no-hierarchical-allgather"],
             "auto": []}[switch]
    for variable in ("TUTTI_HIERARCHICAL_ALLREDUCE", "TUTTI_HIERARCHICAL_ALLGATHER"):
        os.environ.pop(variable, None)
    status, _, _ = tuttirun(["-np", str(total), "-H", hosts_of(spec)] + flags + command,
                            timeout=240)
    if status != 0:
        fail(f"the test program exited {status}")


def namespace_of(host):
    with open(os.path.join(os.environ["NETNS_CLUSTER_DIR"], "nodes"), encoding="utf-8") as f:
        for line in f:
            name, namespace = line.split()[:2]
            if name == host:
                return namespace
    fail(f"no host {host} in the cluster")
    return None


def processes_on(host):
    pids = subprocess.run(["ip", "netns", "pids", namespace_of(host)], capture_output=True,
                          text=True, check=False).stdout.split()
    return pids


def case_fault(args):
    mode, program = args[0], args[1]
    timeout = NETWORK_TIMEOUT_S if mode == "link" else 30
    job = Job([sys.executable, TUTTIRUN, "-np", "4", "-H", hosts_of("2,2"), "--network-timeout",
               str(timeout), program, "120"])
    job.wait_for_output("step 20", timeout=90)
    inject = {"link": ["link", "tnode1", "down"], "crash": ["kill", "tnode1"],
              "ranks": ["kill", "tnode1", os.path.basename(program)]}[mode]
    print(f"cluster_test: netns_cluster {' '.join(inject)}", flush=True)
    subprocess.run([NETNS_CLUSTER] + inject, check=True)
    injected = time.monotonic()
    bound = timeout + LINK_BOUND_EXTRA_S if mode == "link" else CRASH_BOUND_S
    status = job.wait(timeout=bound + 60)
    elapsed = time.monotonic() - injected
    print(f"cluster_test: fault {mode}: tuttirun exited {status} {elapsed:.1f} s after the "
          f"fault (bound {bound:.0f} s)", flush=True)
    if status == 0:
        fail("the job succeeded despite the fault")
    if elapsed > bound:
        fail(f"the job ended {elapsed:.1f} s after the fault, past the bound of {bound:.0f} s")
    report = [line for line in job.err if line.startswith("tuttirun: the job failed")]
    if not report or "host tnode1:" not in report[-1]:
        fail("tuttirun did not name host tnode1 in a closing line")
    # The surviving host's ranks (and its daemon) must be gone, not stuck in a collective.
    deadline = time.monotonic() + 5
    while processes_on("tnode0") and time.monotonic() < deadline:
        time.sleep(0.2)
    if processes_on("tnode0"):
        fail(f"processes still running on tnode0 after the job ended: {processes_on('tnode0')}")


def accuracy_lines(out):
    """The per-epoch loss and accuracy, and the final accuracy, without the timings."""
    lines = re.findall(r"epoch \d+: train loss [0-9.]+, test accuracy [0-9.]+%", out)
    return lines + re.findall(r"final test accuracy: [0-9.]+%", out)


def case_mnist(args):
    """Two pairs of runs that must agree: 2 ranks on 1 host and on 2 hosts (the same sums in
    the same order: identical losses and accuracy), and 4 ranks on 1 host (flat) and on 2 hosts
    x 2 with hierarchical allreduce (sums of 4 in another order: the final accuracy within
    MNIST_HIERARCHICAL_TOLERANCE percentage points)."""
    program = args
    runs = (("1 host x 2 ranks", 2, "tnode0:2", []),
            ("2 hosts x 1 rank", 2, hosts_of("1,1"), []),
            ("1 host x 4 ranks", 4, "tnode0:4", []),
            ("2 hosts x 2 ranks, hierarchical", 4, hosts_of("2,2"), ["--hierarchical-allreduce"]))
    results = []
    for label, ranks, hosts, flags in runs:
        status, out, _ = tuttirun(["-np", str(ranks), "-H", hosts] + flags + program, timeout=300)
        if status != 0:
            fail(f"fashion_mnist on {label} exited {status}")
        results.append(accuracy_lines(out))
        print(f"cluster_test: {label}: {results[-1]}", flush=True)
    if not all(r and r[-1].startswith("final test accuracy") for r in results):
        fail("a run printed no final test accuracy")
    if results[0] != results[1]:
        fail(f"2 ranks on 1 host and on 2 hosts differ: {results[0]} vs {results[1]}")
    final = [float(re.search(r"([0-9.]+)%", r[-1]).group(1)) for r in results[2:]]
    if abs(final[0] - final[1]) > MNIST_HIERARCHICAL_TOLERANCE:
        fail(f"4 ranks flat on 1 host and hierarchical on 2 hosts differ: {final}")


def case_p10(args):
    status, out, _ = tuttirun(["-np", "4", "-H", hosts_of("2,2")] + args, timeout=240)
    if status != 0:
        fail(f"allreduce_benchmark exited {status}")
    if not re.search(r"P10 flat_ms=[0-9.]+ hierarchical_ms=[0-9.]+ raw_ms=[0-9.]+", out):
        fail("no P10 line")


CASES = {"layout": case_layout, "sweep": case_sweep, "fault": case_fault, "mnist": case_mnist,
         "p10": case_p10}


def host_count(case, args):
    return len(args[0].split(",")) if case in ("layout", "sweep") else 2


def main(argv):
    if len(argv) < 2 or argv[0] not in CASES:
        print(__doc__ or "usage: cluster_test.py CASE ARGS...", file=sys.stderr)
        return 2
    case, args = argv[0], argv[1:]
    if "NETNS_CLUSTER_DIR" in os.environ:
        CASES[case](args)
        print(f"cluster_test: {case} {' '.join(args)}: ok", flush=True)
        return 0
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                             check=False).stdout
    if "Open MPI" not in version:
        print("cluster_test: SKIP: the cluster tests launch with Open MPI's mpirun, and mpirun "
              "here is not Open MPI", flush=True)
        return SKIP
    # Into a fresh cluster; its exit status (77 where none can be built) is ours.
    command = [NETNS_CLUSTER, "--hosts", str(host_count(case, args)), "--",
               sys.executable, os.path.abspath(__file__)] + argv
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
