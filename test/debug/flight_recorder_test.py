# SPDX-License-Identifier: Apache-2.0
# Usage: flight_recorder_test.py MODE FAULT_PROGRAM MPIEXEC
# Runs test/debug/fault_program MODE on 3 ranks with the flight recorder dumping into a fresh
# directory, then scripts/tutti-trace on that directory, and checks that the analyzer's report
# names the injected fault (see fault_program.cc for the modes; mode desync is its skip fault
# under TUTTI_DEBUG=DETAIL). Every wait is bounded. Exits
# 0 on success, 1 on failure, 77 (SKIP) where mpiexec is not Open MPI's.
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TUTTI_TRACE = os.environ.get("TRACE_SCRIPT") or os.path.join(HERE, "..", "..", "scripts",
                                                             "tutti-trace")
JOB_TIMEOUT_S = 60
RANKS = 3


def fail(message):
    print(f"flight_recorder_test: FAIL: {message}", flush=True)
    sys.exit(1)


# Mode "desync" runs the program's "skip" fault under TUTTI_DEBUG=DETAIL, with stall limits
# far above the time it may take: only the desync check can stop it in time.
DESYNC_STALL_LIMIT_S = 100
DESYNC_BOUND_S = 30


def job_env(directory, mode):
    env = dict(os.environ)
    env.update({"TUTTI_FLIGHT_RECORDER_DIR": directory,
                "TUTTI_STALL_CHECK_TIME_SECONDS": "1",
                "TUTTI_STALL_SHUTDOWN_TIME_SECONDS": "2",
                "TUTTI_EXIT_GRACE_SECONDS": "10"})
    if mode == "throw":
        env["TUTTI_TIMELINE"] = os.path.join(directory, "timeline.out")
    if mode == "desync":
        env.update({"TUTTI_DEBUG": "DETAIL",
                    "TUTTI_STALL_CHECK_TIME_SECONDS": str(DESYNC_STALL_LIMIT_S),
                    "TUTTI_STALL_SHUTDOWN_TIME_SECONDS": str(DESYNC_STALL_LIMIT_S)})
    return env


def start(mpiexec, program, mode, directory):
    program_mode = "skip" if mode == "desync" else mode
    return subprocess.Popen([mpiexec, "-n", str(RANKS), program, program_mode],
                            env=job_env(directory, mode),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(job):
    """The job's exit status and output, killing it past JOB_TIMEOUT_S."""
    try:
        out, _ = job.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate()
        print(out)
        fail(f"the job did not end within {JOB_TIMEOUT_S} s")
    print(out, flush=True)
    return job.returncode, out


def wait_for_line(job, text):
    """Reads the job's output until a line contains `text` (bounded); returns what was read."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    seen = []
    while time.monotonic() < deadline:
        line = job.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    os.killpg(job.pid, signal.SIGKILL)
    print("".join(seen))
    fail(f"no line with {text!r} from the job")
    return ""


def analyze(directory):
    result = subprocess.run([sys.executable, TUTTI_TRACE, directory], capture_output=True,
                            text=True, timeout=60, check=False)
    print(f"--- scripts/tutti-trace {directory} (exit {result.returncode}):\n{result.stdout}"
          f"{result.stderr}", flush=True)
    if result.returncode != 0:
        fail("tutti-trace failed")
    return result.stdout


def reasons(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        # rank<R>.json only, as tutti-trace: rank<R>.SIGTERM.json is a signal's dump beside an
        # error's.
        if re.fullmatch(r"rank\d+\.json", name):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                dump = json.load(f)
            out[dump["rank"]] = dump["reason"]
    return out


def expect(report, *phrases):
    for phrase in phrases:
        if phrase not in report:
            fail(f"the report lacks {phrase!r}")


def main():
    mode, program, mpiexec = sys.argv[1:4]
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             check=False).stdout
    if "Open MPI" not in version and "OpenRTE" not in version:
        print("flight_recorder_test: SKIP: needs Open MPI's mpirun (SIGTERM, SIGUSR1)")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="tutti_fr_") as directory:
        started = time.monotonic()
        job = start(mpiexec, program, mode, directory)
        if mode == "usr1":
            wait_for_line(job, "ready")
            os.kill(job.pid, signal.SIGUSR1)  # mpirun forwards it to every rank.
        status, output = finish(job)
        seconds = time.monotonic() - started
        why = reasons(directory)
        print(f"flight_recorder_test: job exited {status}; dumps: {why}", flush=True)
        report = analyze(directory)
        if mode == "skip":
            # Ranks 0 and 2 submitted grad.a, grad.b, grad.c in step 2 (seqs 6, 7, 8); rank 1
            # skipped grad.b, so its grad.c is seq 7. The stall shutdown made every rank dump.
            if status != 0 or sorted(why) != [0, 1, 2]:
                fail("expected exit 0 and a dump from every rank")
            expect(report, "rank 1 never submitted seq 7 ALLREDUCE 'grad.b' of set 0; "
                   "ranks 0,2 are waiting in it", "rank 1 submitted 'grad.c' as seq 7 instead")
            if not all(r.startswith("Stalled") for r in why.values()):
                fail(f"dumps not made by the stall shutdown: {why}")
        elif mode == "desync":
            # The coordinator saw rank 1's 'grad.c' where the others have 'grad.b' (seq 7) and
            # stopped the job with Mismatch at once: every rank says so, in its errors (ranks
            # 0 and 2 wait in grad.b; rank 1's grad.a and grad.c are not run) and its dump.
            if status != 0 or sorted(why) != [0, 1, 2]:
                fail("expected exit 0 and a dump from every rank")
            if seconds > DESYNC_BOUND_S:
                fail(f"the job took {seconds:.1f} s: the check should stop it within "
                     f"{DESYNC_BOUND_S} s (the stall limit is {DESYNC_STALL_LIMIT_S} s)")
            if not all(r.startswith("Mismatch: desync in process set 0 (TUTTI_DEBUG=DETAIL)")
                       for r in why.values()):
                fail(f"dumps not made by the desync check: {why}")
            for rank in range(RANKS):
                if f"rank {rank}: desync in process set 0" not in output:
                    fail(f"rank {rank} printed no error naming the desync")
            for phrase in ("seq 7 ALLREDUCE 'grad.c'", "seq 7 ALLREDUCE 'grad.b'",
                           "rank 1's last ops: ", "seq 6 ALLREDUCE 'grad.a', seq 7 ALLREDUCE "
                           "'grad.c'"):
                if phrase not in why[0]:
                    fail(f"the Mismatch lacks {phrase!r}")
            expect(report, "rank 1 never submitted seq 7 ALLREDUCE 'grad.b' of set 0; "
                   "ranks 0,2 are waiting in it", "rank 1 submitted 'grad.c' as seq 7 instead")
        elif mode == "stuck":
            if status != 0 or sorted(why) != [0, 1, 2]:
                fail("expected exit 0 and a dump from every rank")
            expect(report, "rank 1 never submitted seq 6 ALLREDUCE 'grad.a' of set 0; "
                   "ranks 0,2 are waiting in it")
        elif mode == "shape":
            if status != 0 or set(why.values()) != {"dump_flight_recorder()"}:
                fail("expected exit 0 and every rank's dump_flight_recorder() dump")
            expect(report, "seq 4 'grad.b' of set 0: shapes differ: ranks 0,2 [8], rank 1 [9]")
        elif mode == "kill":
            # mpirun ends ranks 0 and 2 with SIGTERM once rank 1 died: they dump on the way out.
            if status == 0 or sorted(why) != [0, 2] or set(why.values()) != {"SIGTERM"}:
                fail("expected a failed job and SIGTERM dumps from ranks 0 and 2 only")
            expect(report, "no dump from rank(s) 1 (dead, or never reached a dump)",
                   "rank 0: in seq 7 ALLREDUCE 'grad.b' of set 0",
                   "rank 2: in seq 7 ALLREDUCE 'grad.b' of set 0")
        elif mode == "throw":
            # Rank 0's std::terminate() dumps with the exception's message and closes its
            # timeline before abort(); mpirun then ends ranks 1 and 2 with SIGTERM. Before,
            # rank 0 left no dump and a timeline cut short (often empty).
            if status == 0 or sorted(why) != [0, 1, 2]:
                fail("expected a failed job and a dump from every rank")
            if why[0] != "std::terminate(): uncaught exception: boom in user code":
                fail(f"rank 0's dump does not name the exception: {why[0]!r}")
            if {why[1], why[2]} != {"SIGTERM"}:
                fail(f"expected SIGTERM dumps from ranks 1 and 2: {why}")
            with open(os.path.join(directory, "timeline.out"), encoding="utf-8") as f:
                names = {e.get("args", {}).get("name") for e in json.load(f)}
            if "grad.a" not in names:
                fail("rank 0's timeline lacks 'grad.a'")
            expect(report, ": std::terminate(): uncaught exception: boom in user code")
        elif mode == "usr1":
            if status != 0 or set(why.values()) != {"SIGUSR1"} or sorted(why) != [0, 1, 2]:
                fail("expected exit 0 (the job went on) and SIGUSR1 dumps from every rank")
            # A snapshot of a running job: a rank may be one op ahead of another, but no op
            # disagrees.
            expect(report, "job ", "3 of 3 ranks dumped")
            for wrong in ("differ", "disagree", "no dump from"):
                if wrong in report:
                    fail(f"the report of a healthy job says {wrong!r}")
        else:
            fail(f"unknown mode {mode}")
    print(f"flight_recorder_test: {mode}: OK", flush=True)


if __name__ == "__main__":
    main()
