# SPDX-License-Identifier: Apache-2.0
# Usage: stuck_peer_test.py MPIEXEC PROGRAM
# A job whose runtime stopped on an error (Stalled) while one rank is alive but stuck must end
# within TUTTI_EXIT_GRACE_SECONDS of the others' exit, with a non-zero status, instead of
# waiting in MPI_Finalize for as long as the stuck rank sleeps (600 s).
import os
import subprocess
import sys
import time

mpiexec, program = sys.argv[1], sys.argv[2]
env = dict(os.environ, TUTTI_STALL_CHECK_TIME_SECONDS="1", TUTTI_STALL_SHUTDOWN_TIME_SECONDS="2",
           TUTTI_EXIT_GRACE_SECONDS="3")
start = time.monotonic()
try:
    run = subprocess.run([mpiexec, "-n", "2", "--oversubscribe", program], env=env,
                         capture_output=True, text=True, timeout=90)
except subprocess.TimeoutExpired:
    print("FAIL: the job did not end within 90 s")
    sys.exit(1)
elapsed = time.monotonic() - start
print(run.stdout)
print(run.stderr)
ok = True
if run.returncode == 0:
    print("FAIL: the job exited 0 though a rank was stuck")
    ok = False
# Stall shutdown at ~2-3 s, then a 3 s grace; generous for loaded machines.
if elapsed > 45:
    print(f"FAIL: the job took {elapsed:.1f} s to end")
    ok = False
if "Stalled" not in run.stdout:
    print("FAIL: the surviving rank did not report Stalled")
    ok = False
if "TUTTI_EXIT_GRACE_SECONDS" not in run.stderr:
    print("FAIL: no message explaining the abort")
    ok = False
print(f"job ended in {elapsed:.1f} s with status {run.returncode}")
sys.exit(0 if ok else 1)
