# SPDX-License-Identifier: Apache-2.0
# Usage: job_end_test.py MPIEXEC NP PROGRAM STDOUT_TEXT STDERR_TEXT
# Runs PROGRAM on NP ranks, one of which stays alive but stuck (for 600 s) after an error, and
# checks that the job still ends within bounded time (TUTTI_EXIT_GRACE_SECONDS=3 here) with a
# non-zero status, that the program printed STDOUT_TEXT and that Tutti explained the abort with
# STDERR_TEXT. Before the bound, such jobs waited for the stuck rank.
import os
import subprocess
import sys
import time

mpiexec, np, program, stdout_text, stderr_text = sys.argv[1:6]
env = dict(os.environ, TUTTI_STALL_CHECK_TIME_SECONDS="1", TUTTI_STALL_SHUTDOWN_TIME_SECONDS="2",
           TUTTI_EXIT_GRACE_SECONDS="3")
start = time.monotonic()
try:
    run = subprocess.run([mpiexec, "-n", np, program], env=env,
                         capture_output=True, text=True, timeout=90)
except subprocess.TimeoutExpired:
    print("FAIL: the job did not end within 90 s")
    sys.exit(1)
elapsed = time.monotonic() - start
print(run.stdout)
print(run.stderr)
failures = []
if run.returncode == 0:
    failures.append("the job exited 0 though a rank was stuck")
if elapsed > 45:  # The error comes within ~3 s, then a 3 s grace; generous for loaded machines.
    failures.append(f"the job took {elapsed:.1f} s to end")
if stdout_text not in run.stdout:
    failures.append(f"no '{stdout_text}' on stdout")
if stderr_text not in run.stderr:
    failures.append(f"no '{stderr_text}' on stderr")
for f in failures:
    print("FAIL:", f)
print(f"job ended in {elapsed:.1f} s with status {run.returncode}")
sys.exit(1 if failures else 0)
