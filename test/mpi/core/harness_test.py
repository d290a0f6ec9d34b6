#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the mpi suite's harness (test/support/mpi_catch.h): a rank that fails, in each way
harness_program.cc can fail on purpose, is named in the log with the reason.

Usage: harness_test.py MPIEXEC PROGRAM NP [TAG_FLAG]
TAG_FLAG is the flag test/meson.build gives every mpiexec test (--tag-output or -prepend-rank).
"""
import os
import re
import subprocess
import sys

TIMEOUT_S = 60


def tag_pattern(tag_flag, rank):
    """The prefix mpiexec writes before each line of `rank`."""
    if tag_flag == "--tag-output":  # Open MPI: "[jobid,rank]<stderr>:"
        return r"\[\d+,%d\]<std(out|err)>:" % rank
    if tag_flag == "-prepend-rank":  # MPICH's Hydra: "[rank] "
        return r"\[%d\] " % rank
    return ""


def run(mpiexec, program, np, tag_flag, mode):
    env = dict(os.environ)
    if mode:
        env["HARNESS_FAILURE"] = mode
    else:
        env.pop("HARNESS_FAILURE", None)
    command = [mpiexec] + ([tag_flag] if tag_flag else []) + ["-n", str(np), program]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=TIMEOUT_S, check=False)
    return done.returncode, done.stdout


def line_with(log, *patterns):
    """The first line that matches every pattern, or None."""
    for line in log.splitlines():
        if all(re.search(p, line) for p in patterns):
            return line
    return None


def main():
    mpiexec, program, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tag_flag = sys.argv[4] if len(sys.argv) > 4 else ""
    last = np - 1
    failures = []

    def expect(what, condition, log):
        if not condition:
            failures.append(what + "\n--- log ---\n" + log + "--- end ---")

    code, log = run(mpiexec, program, np, tag_flag, "")
    expect("without a failure every rank passes (exit 0)", code == 0, log)

    code, log = run(mpiexec, program, np, tag_flag, "check")
    expect("a failed check on rank %d fails the test" % last, code != 0, log)
    expect("rank %d's report is in the log, naming the failed expression" % last,
           line_with(log, r"\[rank %d\] " % last, r"world_rank\(\) != last") is not None, log)
    expect("rank 0 names rank %d as the failing rank" % last,
           line_with(log, r"FAILED on rank\(s\) %d of %d" % (last, np)) is not None, log)

    code, log = run(mpiexec, program, np, tag_flag, "throw")
    expect("an exception on rank 1 fails the test", code != 0, log)
    expect("rank 1's report names the exception",
           line_with(log, r"\[rank 1\] ", "deliberate failure on rank 1") is not None, log)

    code, log = run(mpiexec, program, np, tag_flag, "abort")
    expect("an abort on rank %d fails the test" % last, code != 0, log)
    if tag_flag:
        expect("the abort's message carries rank %d's tag" % last,
               line_with(log, tag_pattern(tag_flag, last), "deliberate abort") is not None, log)

    for failure in failures:
        print("FAILED: " + failure)
    if failures:
        print("harness: %d expectation(s) failed at np=%d" % (len(failures), np))
        return 1
    print("harness: every deliberate failure was named with its rank at np=%d" % np)
    return 0


if __name__ == "__main__":
    sys.exit(main())
