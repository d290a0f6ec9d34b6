# SPDX-License-Identifier: Apache-2.0
# Usage: mixed_settings_test.py MPIEXEC PROGRAM
# Ranks started with different wire-relevant settings (TUTTI_FUSION_THRESHOLD=0 and
# TUTTI_CACHE_CAPACITY=1 on rank 0 only, then on rank 1 only) must run correctly on rank 0's
# values, with a warning naming the knob, instead of corrupting memory or hanging. Settings that
# spell the same value differently (01024 and the default 1024) are not warned about.
import subprocess
import sys

mpiexec, program = sys.argv[1], sys.argv[2]
# Set through env(1) rather than a launcher flag, so the same command runs under Open MPI and
# MPICH; oversubscription comes from the test's environment (test/meson.build).
odd = ["env", "TUTTI_FUSION_THRESHOLD=0", "TUTTI_CACHE_CAPACITY=1"]
failures = []
for first, second in ((odd, []), ([], odd)):
    command = ([mpiexec, "-np", "1"] + first + [program, ":", "-np", "1"] + second +
               [program])
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        failures.append(f"{' '.join(command)} hung")
        continue
    print(run.stdout)
    print(run.stderr)
    if run.returncode != 0:
        failures.append(f"{' '.join(command)} exited {run.returncode}")
    if "TUTTI_FUSION_THRESHOLD" not in run.stderr:
        failures.append("no warning naming TUTTI_FUSION_THRESHOLD")
# The same values spelt differently: compared as numbers, not as text (before, both warned).
same = [mpiexec, "-np", "1", "env", "TUTTI_CACHE_CAPACITY=01024", program, ":", "-np", "1",
        "env", "TUTTI_FUSION_THRESHOLD=1048576", program]
try:
    run = subprocess.run(same, capture_output=True, text=True, timeout=90)
    print(run.stdout)
    print(run.stderr)
    if run.returncode != 0:
        failures.append(f"{' '.join(same)} exited {run.returncode}")
    for knob in ("TUTTI_CACHE_CAPACITY", "TUTTI_FUSION_THRESHOLD"):
        if knob in run.stderr:
            failures.append(f"{knob}: warned about a value equal to rank 0's")
except subprocess.TimeoutExpired:
    failures.append(f"{' '.join(same)} hung")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
