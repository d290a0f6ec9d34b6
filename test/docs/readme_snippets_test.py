# SPDX-License-Identifier: Apache-2.0
# Usage: readme_snippets_test.py README BUILD_DIR MPIEXEC
# Every complete program in README.md (a ```cpp block with `int main`) is compiled against the
# build's libtutti and run on 2 ranks, each bounded: a snippet that does not compile, fails or
# hangs fails the test. A block preceded by the line `<!-- snippet: sketch -->` is a sketch
# (it calls functions the reader writes) and is only listed. Before this test, a snippet called
# a function Tutti does not have, and another ended in a receive no rank sent to.
# Exits 0 on success, 1 on failure, 77 (SKIP) without Open MPI's mpicxx or Eigen's pkg-config.
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 60
RANKS = 2
BLOCK = re.compile(r"(<!-- snippet: sketch -->\n)?```cpp\n(.*?)```", re.S)


def programs(readme):
    """(line number, source, is_sketch) of every ```cpp block with a main()."""
    text = open(readme, encoding="utf-8").read()
    for match in BLOCK.finditer(text):
        if "int main" in match.group(2):
            line = text.count("\n", 0, match.start(2)) + 1
            yield line, match.group(2), match.group(1) is not None


def flags(command):
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return result.stdout.split() if result.returncode == 0 else None


def run(mpiexec, binary, env):
    """(exit status or "timeout", output) of `binary` on RANKS ranks. The job is a process
    group of its own, killed whole past RUN_TIMEOUT_S: killing mpiexec alone leaves its ranks."""
    job = subprocess.Popen([mpiexec, "-n", str(RANKS), binary], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=RUN_TIMEOUT_S)
        return job.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        return "timeout", output


def main():
    readme, build_dir, mpiexec = sys.argv[1:4]
    source_dir = os.path.dirname(os.path.abspath(readme))
    mpi = flags(["mpicxx", "--showme:compile"]) if shutil.which("mpicxx") else None
    mpi_link = flags(["mpicxx", "--showme:link"]) if mpi is not None else None
    eigen = flags(["pkg-config", "--cflags", "eigen3"])
    if mpi is None or mpi_link is None or eigen is None:
        print("readme_snippets_test: SKIP: needs Open MPI's mpicxx and Eigen's pkg-config")
        sys.exit(77)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    failed = []
    with tempfile.TemporaryDirectory(prefix="tutti_snippets_") as work:
        for line, source, sketch in programs(readme):
            if sketch:
                print(f"README.md:{line}: a sketch, not built", flush=True)
                continue
            path = os.path.join(work, f"snippet_{line}.cc")
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            binary = path[:-3]
            compile_command = (["c++", "-std=c++20", "-o", binary, path,
                                "-I", os.path.join(source_dir, "include"), "-I", build_dir]
                               + eigen + mpi + ["-L", build_dir, "-Wl,-rpath," + build_dir,
                                                "-ltutti"] + mpi_link)
            built = subprocess.run(compile_command, capture_output=True, text=True,
                                   timeout=COMPILE_TIMEOUT_S, check=False)
            if built.returncode != 0:
                print(f"README.md:{line}: does not compile:\n{built.stderr[-3000:]}", flush=True)
                failed.append(line)
                continue
            status, output = run(mpiexec, binary, env)
            if status != 0:
                print(f"README.md:{line}: exit {status} on {RANKS} ranks:\n{output[-3000:]}",
                      flush=True)
                failed.append(line)
            else:
                print(f"README.md:{line}: built and ran on {RANKS} ranks", flush=True)
    if failed:
        print(f"readme_snippets_test: FAIL: the programs at README.md lines {failed}")
        sys.exit(1)
    print("readme_snippets_test: OK")


if __name__ == "__main__":
    main()
