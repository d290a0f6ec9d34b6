# SPDX-License-Identifier: Apache-2.0
# Usage: fake_elastic_job.py ACTION [ARGS...]
# Stands in for mpirun in the elastic driver's tests (elastic_driver_test.py): prints what
# Open MPI prints when a rank fails, exits as a Tutti job would.
#   exit CODE                  exits with CODE
#   sleep SECONDS              exits 0 after SECONDS (SIGUSR2 kills it)
#   killed HOST SIGNAL CODE    Open MPI's report of a rank on HOST killed by SIGNAL; exits CODE
#   aborted HOST CODE          Open MPI's report of a rank on HOST calling abort; exits CODE
#   wait-stop                  exits 75 (the relaunch status) on SIGUSR2; 0 after 30 s
#   die-on-stop HOST           on SIGUSR2, reports a rank on HOST killed by it (a rank with no
#                              handler yet) and exits 140; 0 after 30 s
#   fail-on-stop CODE READY    on SIGUSR2, exits CODE (a program failing with its own error
#                              after the stop request); creates the file READY once it handles
#                              SIGUSR2; 0 after 30 s
import signal
import sys
import time


def report_killed(host, signum):
    print(f"mpirun noticed that process rank 1 with PID 4242 on node {host} exited on signal "
          f"{signum} ({signal.strsignal(int(signum))}).", file=sys.stderr, flush=True)


def main(argv):
    action = argv[0]
    if action == "exit":
        return int(argv[1])
    if action == "sleep":
        time.sleep(float(argv[1]))
        return 0
    if action == "killed":
        report_killed(argv[1], argv[2])
        return int(argv[3])
    if action == "aborted":
        print(f"mpirun has exited due to process rank 3 with PID 1234 on\nnode {argv[1]} "
              'calling "abort". This may have caused other processes', file=sys.stderr,
              flush=True)
        return int(argv[2])
    if action in ("wait-stop", "die-on-stop", "fail-on-stop"):
        def on_stop(_signum, _frame):
            if action == "die-on-stop":
                report_killed(argv[1], int(signal.SIGUSR2))
                sys.exit(140)
            sys.exit(int(argv[1]) if action == "fail-on-stop" else 75)
        signal.signal(signal.SIGUSR2, on_stop)
        if action == "fail-on-stop":
            with open(argv[2], "w", encoding="utf-8"):
                pass
        time.sleep(30)
        return 0
    print(f"fake_elastic_job: unknown action {action}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
