# SPDX-License-Identifier: Apache-2.0
# The examples refuse a command line they would not run as asked (an unknown flag or argument, a
# flag without its value, a value that is not wholly a number in range, a flag of a mode not
# chosen) with exit 2 and a message naming the flag and the value, before any training or timing;
# --help prints the usage and exits 0. Each used to run anyway (ignoring the flag, or reading
# "8x" as 8 and "abc" as 0), or to end in an uncaught exception.
#
# Usage: python3 examples/example_flags_test.py MPIEXEC PROGRAM...
#   PROGRAM: the built fashion_mnist, rpc_parameter_server, ring_allreduce, rpc_benchmark,
#   p2p_benchmark, linear_regression, rpc_autograd, synthetic_benchmark, allreduce_benchmark,
#   zero_benchmark and comm_hook_benchmark, and libtorch_mnist where LibTorch was found (the
#   one optional program), in any order (found by name).
# One rank each: the flags are read before init (fashion_mnist's right after it), so a refusal
# takes no longer than starting the job. --data-dir names no directory, so that a program which
# took its flags would fail on the data (exit 1) rather than train.
import concurrent.futures
import os
import subprocess
import sys

NO_DATA = ["--data-dir", "/nonexistent/example_flags_test"]

# Per program: (flags, what stderr must say) for each refused command line.
REFUSED = {
    "fashion_mnist": [
        (["--period", "8"] + NO_DATA, "--period needs --wrapper localsgd"),
        (["--wrapper", "ddp", "--warmup-steps", "1"] + NO_DATA,
         "--warmup-steps needs --wrapper localsgd"),
        (["--powersgd-rank", "4"] + NO_DATA, "--powersgd-rank needs --hook powersgd"),
        (["--wrapper", "ddp", "--hook", "fp16", "--powersgd-start", "5"] + NO_DATA,
         "--powersgd-start needs --hook powersgd"),
        (["--hook", "fp16"] + NO_DATA, "--hook needs --wrapper ddp"),
        (["--wrapper", "zero", "--checkpoint", "/tmp/never_written.ckpt"] + NO_DATA,
         "--wrapper zero shards the optimizer state: --elastic commits it, --checkpoint does not"),
        (["--epochs", "2x"] + NO_DATA, "bad --epochs '2x'"),
    ],
    "rpc_parameter_server": [
        (["--epochs", "-3"] + NO_DATA, "bad --epochs '-3'"),
        (["--batch-size", "8x"] + NO_DATA, "bad --batch-size '8x'"),
        (["--batch-size", "-1"] + NO_DATA, "bad --batch-size '-1'"),
        (["--batch-size", "0"] + NO_DATA, "bad --batch-size '0'"),
        (["--limit", "5x"] + NO_DATA, "bad --limit '5x'"),
        (["--lr", "abc"] + NO_DATA, "bad --lr 'abc'"),
        (["--lr", "0"] + NO_DATA, "bad --lr '0'"),
        (["--min-accuracy", "nan"] + NO_DATA, "bad --min-accuracy 'nan'"),
    ],
    "ring_allreduce": [
        (["--elements", "-5"], "bad --elements '-5'"),
        (["--elements", "abc"], "bad --elements 'abc'"),
        (["--bogus", "3"], "unknown flag --bogus"),
        (["--elements"], "--elements needs a value"),
    ],
    "rpc_benchmark": [
        (["--iterations", "abc"], "bad --iterations 'abc'"),
        (["--iterations", "0"], "bad --iterations '0'"),
        (["--mb-iterations", "0"], "bad --mb-iterations '0'"),
        (["--bogus", "1"], "unknown flag --bogus"),
        (["--mb-iterations"], "--mb-iterations needs a value"),
    ],
    "p2p_benchmark": [
        (["--iterations", "abc"], "bad --iterations 'abc'"),
        (["--mb-iterations", "5x"], "bad --mb-iterations '5x'"),
        (["--bogus", "1"], "unknown flag --bogus"),
        (["--iterations"], "--iterations needs a value"),
    ],
    "linear_regression": [
        (["extra"], "unexpected argument 'extra'"),
        (["--verbose"], "unknown flag --verbose"),
    ],
    "rpc_autograd": [
        (["--verbose"], "unknown flag --verbose"),
    ],
    # The benchmarks exited 2 on --help, printed the usage without naming the bad flag, and
    # allreduce_benchmark read --repeats abc as 1 (atoi).
    "synthetic_benchmark": [
        (["--batch-size", "8x"], "bad --batch-size '8x'"),
        (["--wrapper", "zero"], "bad --wrapper 'zero'"),
        (["--bogus", "1"], "unknown flag --bogus"),
        (["--num-iters"], "--num-iters needs a value"),
    ],
    "allreduce_benchmark": [
        (["--repeats", "abc"], "bad --repeats 'abc'"),
        (["--p10", "--p10-mb", "-4"], "bad --p10-mb '-4'"),
        (["--transport", "tcp"], "bad --transport 'tcp'"),
        (["--bogus"], "unknown flag --bogus"),
    ],
    "zero_benchmark": [
        (["--iters", "0"], "bad --iters '0'"),
        (["--tensors", "x"], "bad --tensors 'x'"),
        (["--bogus", "1"], "unknown flag --bogus"),
    ],
    "libtorch_mnist": [
        (["--epochs", "2x"] + NO_DATA, "bad --epochs '2x'"),
        (["--device", "tpu"] + NO_DATA, "bad --device 'tpu'"),
        (["--commit-every", "5"] + NO_DATA, "--commit-every needs --elastic"),
        (["--frobnicate"] + NO_DATA, "unknown flag '--frobnicate'"),
    ],
    "comm_hook_benchmark": [
        (["--rounds", "-1"], "bad --rounds '-1'"),
        (["--grads"], "--grads needs a value"),
        (["--bogus", "1"], "unknown flag --bogus"),
    ],
}


# Built only where LibTorch was found.
OPTIONAL = {"libtorch_mnist"}


def run(mpiexec, args):
    return subprocess.run([mpiexec, "-n", "1", "--oversubscribe"] + args, capture_output=True,
                          text=True, timeout=120)


def refused(mpiexec, name, program, flags, message):
    done = run(mpiexec, [program] + flags)
    if done.returncode == 2 and message in done.stderr:
        return None
    return (f"{name} {flags}: exit {done.returncode}, stderr {done.stderr!r}; expected exit 2 "
            f"and {message!r}")


def helped(mpiexec, name, program):
    done = run(mpiexec, [program, "--help"])
    if done.returncode == 0 and f"usage: {name}" in done.stdout:
        return None
    return (f"{name} --help: exit {done.returncode}, stdout {done.stdout!r}; expected exit 0 and "
            "the usage")


def main(mpiexec, programs):
    by_name = {os.path.basename(p): p for p in programs}
    faults = [f"no {name} given" for name in REFUSED
              if name not in by_name and name not in OPTIONAL]
    faults += [f"{p}: not a program this test knows" for n, p in by_name.items()
               if n not in REFUSED]
    # Concurrently: mpiexec waits about 2 s after a rank exits non-zero, idle.
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        checks = []
        for name, program in by_name.items():
            if name not in REFUSED:
                continue
            checks.append(pool.submit(helped, mpiexec, name, program))
            checks += [pool.submit(refused, mpiexec, name, program, flags, message)
                       for flags, message in REFUSED[name]]
            print(f"{name}: {len(REFUSED[name])} refused command lines and --help")
        faults += [c.result() for c in checks if c.result() is not None]
    for fault in faults:
        print("example_flags_test: " + fault, file=sys.stderr)
    return 1 if faults else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: example_flags_test.py MPIEXEC PROGRAM...")
    sys.exit(main(sys.argv[1], sys.argv[2:]))
