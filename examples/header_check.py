# SPDX-License-Identifier: Apache-2.0
# Runs a benchmark and fails unless its first line of output is the machine line of
# examples/machine_line.h (issue 26: every benchmark names the CPU, the MPI library and the
# binding it ran with, so that figures from different machines are never compared unawares).
#
# Usage: python3 examples/header_check.py RANKS COMMAND [ARG...]
# COMMAND's output is passed through; its exit status is this script's when it is not 0.
# RANKS: how many ranks the binding must list.
import re
import subprocess
import sys

# cpu=<model name> cpu_family=<n or ?> cpu_model=<n or ?> l2=<size or ?> mpi=<library>
# ranks=<n> binding=<rank>:<cpus>;...
LINE = re.compile(
    r"cpu=(?P<cpu>.+) cpu_family=(\d+|\?) cpu_model=(\d+|\?) l2=(\w+|\?) mpi=(?P<mpi>.+) "
    r"ranks=(?P<ranks>\d+) binding=(?P<binding>\d+:[\d,]+(;\d+:[\d,]+)*)$"
)


def check(first_line, ranks):
    """The fault in `first_line`, or None."""
    match = LINE.match(first_line)
    if match is None:
        return f"the first line is not a machine line: {first_line!r}"
    if match["cpu"].strip() in ("", "unknown") or match["mpi"].strip() == "":
        return f"the machine line names no CPU or no MPI library: {first_line!r}"
    if int(match["ranks"]) != ranks:
        return f"the machine line says ranks={match['ranks']}, the job has {ranks}"
    listed = [int(part.split(":")[0]) for part in match["binding"].split(";")]
    if listed != list(range(ranks)):
        return f"the binding lists ranks {listed}, not 0..{ranks - 1}"
    return None


def main(ranks, command):
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=600)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        return done.returncode
    lines = done.stdout.splitlines()
    fault = check(lines[0] if lines else "", ranks)
    if fault is not None:
        print(f"header_check: {fault}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: header_check.py RANKS COMMAND [ARG...]")
    sys.exit(main(int(sys.argv[1]), sys.argv[2:]))
