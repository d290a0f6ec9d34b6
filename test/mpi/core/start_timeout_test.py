# SPDX-License-Identifier: Apache-2.0
# Usage: start_timeout_test.py MPIEXEC PROGRAM
# TUTTI_START_TIMEOUT bounds how long init() waits for the job's other ranks (Note [A start
# timeout that covers MPI_Init] in ops/mpi/mpi_transport.cc), whoever starts MPI. Two ranks,
# rank 1 late by LATE seconds, far beyond a 2 s timeout:
# - init() starts MPI: MPI_Init_thread waits for every process, so the punctual rank's watchdog
#   ends it with status 1 and a message naming the knob, and the launcher ends the job, long
#   before the late rank would have arrived;
# - the program started MPI itself: init() fails on the punctual rank with Communication,
#   naming the knob;
# - a rank late by 1 s within a 10 s timeout: both start.
import os
import subprocess
import sys
import time

LATE = 40  # Seconds; a job that waited for the late rank takes at least this long.
BOUND = 20  # Seconds: a 2 s timeout, the launcher's teardown and a loaded machine's slack.


def run(mpiexec, program, mode, late, timeout):
    start = time.monotonic()
    # Through the environment, which Open MPI's and MPICH's launchers both pass on locally.
    done = subprocess.run([mpiexec, "-n", "2", program, mode, str(late)], capture_output=True,
                          text=True, timeout=LATE + 60, check=False,
                          env=dict(os.environ, TUTTI_START_TIMEOUT=str(timeout)))
    elapsed = time.monotonic() - start
    print(f"--- {mode} late {late} s, timeout {timeout} s: exit {done.returncode} after "
          f"{elapsed:.1f} s\n{done.stdout}{done.stderr}", flush=True)
    return done, elapsed


def main(mpiexec, program):
    faults = []
    done, elapsed = run(mpiexec, program, "tutti", LATE, 2)
    if done.returncode == 0 or elapsed > BOUND:
        faults.append(f"init() starting MPI: exit {done.returncode} after {elapsed:.1f} s; "
                      f"expected a failed job within {BOUND} s")
    if "did not return within TUTTI_START_TIMEOUT (2 s)" not in done.stderr:
        faults.append("init() starting MPI: no message naming TUTTI_START_TIMEOUT")
    done, elapsed = run(mpiexec, program, "app", LATE, 2)
    if done.returncode == 0 or elapsed > BOUND:
        faults.append(f"MPI started by the program: exit {done.returncode} after {elapsed:.1f} "
                      f"s; expected a failed job within {BOUND} s")
    if ("rank 0: init failed: Communication: not every rank called tutti::init() within "
            "TUTTI_START_TIMEOUT (2 s)") not in done.stdout:
        faults.append("MPI started by the program: rank 0's init() did not fail with "
                      "Communication naming TUTTI_START_TIMEOUT")
    done, _ = run(mpiexec, program, "tutti", 1, 10)
    if done.returncode != 0 or done.stdout.count(": init ok") != 2:
        faults.append(f"a rank late by 1 s within a 10 s timeout: exit {done.returncode}; "
                      "expected both ranks to start")
    for fault in faults:
        print("start_timeout_test: FAIL: " + fault, flush=True)
    return 1 if faults else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: start_timeout_test.py MPIEXEC PROGRAM")
    sys.exit(main(sys.argv[1], sys.argv[2]))
