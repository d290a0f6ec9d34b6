# SPDX-License-Identifier: Apache-2.0
# Usage: job_end_test.py MPIEXEC NP PROGRAM STDOUT_TEXT STDERR_TEXT
# Runs PROGRAM on NP ranks, one of which stays alive but stuck (for 600 s) after an error, and
# checks that the job still ends within bounded time (TUTTI_EXIT_GRACE_SECONDS=3 here) with a
# non-zero status, that the program printed STDOUT_TEXT and that Tutti explained the abort with
# STDERR_TEXT. Before the bound, such jobs waited for the stuck rank. The bounds are multiplied
# by TEST_TIME_SCALE (Note [Time bounds in tests] in test/support/mpi_test_util.h).
import os
import subprocess
import sys
import time

mpiexec, np, program, stdout_text, stderr_text = sys.argv[1:6]
try:
    scale = max(1.0, float(os.environ.get("TEST_TIME_SCALE", "1")))
except ValueError:
    scale = 1.0
bound_s = 45 * scale  # The error comes within ~3 s, then a 3 s grace; generous for loaded machines.
kill_s = 2 * bound_s
env = dict(os.environ, TUTTI_STALL_CHECK_TIME_SECONDS="1", TUTTI_STALL_SHUTDOWN_TIME_SECONDS="2",
           TUTTI_EXIT_GRACE_SECONDS="3")
start = time.monotonic()
try:
    run = subprocess.run([mpiexec, "-n", np, program], env=env,
                         capture_output=True, text=True, timeout=kill_s)
except subprocess.TimeoutExpired:
    print(f"FAIL: the job did not end within {kill_s:.0f} s")
    sys.exit(1)
elapsed = time.monotonic() - start
print(run.stdout)
print(run.stderr)
failures = []
if run.returncode == 0:
    failures.append("the job exited 0 though a rank was stuck")
if elapsed > bound_s:
    failures.append(f"the job took {elapsed:.1f} s to end (bound {bound_s:.0f} s)")
if stdout_text not in run.stdout:
    failures.append(f"no '{stdout_text}' on stdout")
if stderr_text not in run.stderr:
    failures.append(f"no '{stderr_text}' on stderr")
for f in failures:
    print("FAIL:", f)
print(f"job ended in {elapsed:.1f} s with status {run.returncode}")
sys.exit(1 if failures else 0)
