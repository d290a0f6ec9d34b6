# SPDX-License-Identifier: Apache-2.0
# allreduce_benchmark refuses a combination of flags it would not run as asked (a mode that
# replaces P1-P4 with another such mode or with a flag that changes P1, a CPU-only mode with
# --device cuda, --p10-mb without --p10, ...) with exit 2 and a message naming the fault, and
# --recorder with TUTTI_FLIGHT_RECORDER_SIZE=0 (nothing to compare) likewise; --recorder itself
# runs a round end to end and prints its summary line. Timings are printed, never asserted.
#
# Usage: python3 examples/benchmark_flags_test.py MPIEXEC build/examples/allreduce_benchmark
import os
import re
import subprocess
import sys

REFUSED = [
    (["--stores", "--recorder"], "exclude one another"),
    (["--p10", "--autotune"], "exclude one another"),
    (["--recorder", "--sweep-fusion"], "which --p10, --autotune, --stores and --recorder replace"),
    (["--stores", "--transport", "mpi"], "which --p10, --autotune"),
    (["--recorder", "--device", "cuda"], "run on the CPU only"),
    (["--p10", "--device", "cuda"], "--p10 runs on the CPU only"),
    (["--p10-mb", "4"], "--p10-mb needs --p10"),
    (["--kernel-repeats", "3"], "--kernel-repeats needs --device cuda"),
    (["--recorder", "--grads", "x.txt"], "--recorder takes no --grads"),
]


def run(mpiexec, ranks, args, env=None):
    return subprocess.run([mpiexec, "-n", str(ranks), "--oversubscribe"] + args,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def main(mpiexec, program):
    faults = []
    for flags, message in REFUSED:
        done = run(mpiexec, 1, [program] + flags)
        if done.returncode != 2 or message not in done.stderr:
            faults.append(f"{flags}: exit {done.returncode}, stderr {done.stderr!r}; expected "
                          f"exit 2 and {message!r}")
    done = run(mpiexec, 2, [program, "--recorder", "--repeats", "1"],
               {"TUTTI_FLIGHT_RECORDER_SIZE": "0"})
    if done.returncode != 2 or "leaves nothing to compare" not in done.stderr:
        faults.append(f"--recorder with the recorder off: exit {done.returncode}, stderr "
                      f"{done.stderr!r}")
    done = run(mpiexec, 2, [program, "--recorder", "--repeats", "1"])
    sys.stdout.write(done.stdout)
    summary = re.search(r"^P3-recorder rounds=1 steps=9 on_ms=[\d.]+ off_ms=[\d.]+ raw_ms=[\d.]+ "
                        r"on_over_off=[\d.]+ on_over_raw=[\d.]+ off_over_raw=[\d.]+$",
                        done.stdout, re.MULTILINE)
    if done.returncode != 0 or summary is None:
        faults.append(f"--recorder --repeats 1: exit {done.returncode}, no summary line or "
                      f"stderr {done.stderr!r}")
    for fault in faults:
        print("benchmark_flags_test: " + fault, file=sys.stderr)
    return 1 if faults else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: benchmark_flags_test.py MPIEXEC ALLREDUCE_BENCHMARK")
    sys.exit(main(sys.argv[1], sys.argv[2]))
