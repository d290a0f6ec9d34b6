# SPDX-License-Identifier: Apache-2.0
# Usage: rpc_peer_death_test.py PROGRAM MPIEXEC
# Runs test/debug/rpc_peer_death_program on 3 ranks under Open MPI's --enable-recovery (the
# survivors of a dead rank keep running, as they would under a launcher that does not end the
# job): rank 2 dies while rank 0 waits in rpc_sync() to it and rank 1 in an RRef's to_here(),
# both with a 2 s timeout. Each survivor's wait must end with an error naming the dead worker
# within the timeout plus a margin, never hang. Exits 0 on success, 1 on failure, 77 (SKIP)
# where mpiexec is not Open MPI's.
import os
import re
import signal
import subprocess
import sys
import time

CALL_TIMEOUT_S = 2.0
MARGIN_S = 2.0 * float(os.environ.get("TEST_TIME_SCALE", "1"))
JOB_TIMEOUT_S = 60


def fail(message):
    print(f"rpc_peer_death_test: FAIL: {message}", flush=True)
    sys.exit(1)


def main():
    program, mpiexec = sys.argv[1:3]
    # mpirun --enable-recovery waits for ever on a program it cannot start (seen where a build
    # left this suite's programs out): say so at once instead of after JOB_TIMEOUT_S.
    if not os.access(program, os.X_OK):
        fail(f"{program} is not an executable file (not built here?)")
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             check=False).stdout
    if "Open MPI" not in version and "OpenRTE" not in version:
        print("rpc_peer_death_test: SKIP: needs Open MPI's mpirun --enable-recovery")
        sys.exit(77)
    job = subprocess.Popen([mpiexec, "--enable-recovery", "-n", "3", program],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        out, _ = job.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate()
        print(out)
        fail(f"the job did not end within {JOB_TIMEOUT_S} s")
    print(out, flush=True)
    for rank, what in ((0, "rpc_sync"), (1, "to_here")):
        match = re.search(rf"^rank {rank}: (\w+) after ([0-9.]+) s: (.*)$", out, re.MULTILINE)
        if not match:
            fail(f"rank {rank}'s {what} did not end with an error")
        code, seconds, message = match.group(1), float(match.group(2)), match.group(3)
        if "'w2'" not in message:
            fail(f"rank {rank}'s error does not name the dead worker w2: {message}")
        if seconds > CALL_TIMEOUT_S + MARGIN_S:
            fail(f"rank {rank}'s {what} ended after {seconds:.2f} s, past the {CALL_TIMEOUT_S} s "
                 f"timeout plus {MARGIN_S} s")
        print(f"rpc_peer_death_test: rank {rank}'s {what}: {code} after {seconds:.2f} s",
              flush=True)
    print("rpc_peer_death_test: OK", flush=True)


if __name__ == "__main__":
    main()
