# SPDX-License-Identifier: Apache-2.0
# Tests of scripts/tuttirun, the horovodrun-compatible launcher.
#
# Usage: TUTTIRUN=scripts/tuttirun python3 test/launcher/tuttirun_test.py [-v]
# (without TUTTIRUN the script is found relative to this file). The command-building functions
# are tested in-process; errors, --dry-run, --check-build and a few real mpirun jobs run the
# script as a subprocess. Real jobs need OpenMPI's mpirun on PATH.

import contextlib
import importlib.machinery
import importlib.util
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TUTTIRUN = os.environ.get("TUTTIRUN") or os.path.join(HERE, "..", "..", "scripts", "tuttirun")
TUTTIRUN = os.path.abspath(TUTTIRUN)


def load_launcher():
    loader = importlib.machinery.SourceFileLoader("tuttirun", TUTTIRUN)
    spec = importlib.util.spec_from_loader("tuttirun", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


tuttirun = load_launcher()

BASE_ENV = {"PATH": "/usr/bin:/bin"}
DEFAULT_BINDING = ["--bind-to", "none", "--map-by", "slot"]


def parse(argv):
    """parse_args with argparse's stderr swallowed (error cases raise SystemExit)."""
    with contextlib.redirect_stderr(io.StringIO()):
        return tuttirun.parse_args(argv)


def build(argv, environ=None, cpu_count=64, is_root=False):
    environ = dict(BASE_ENV if environ is None else environ)
    return tuttirun.build_command(parse(argv), environ, cpu_count, is_root)


def exported(command):
    """Names following each -x in an mpirun command."""
    return [command[i + 1] for i, arg in enumerate(command) if arg == "-x"]


def clean_environ(**extra):
    """This process's environment without TUTTI_*/HOROVOD_* settings, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "HOROVOD_"))}
    env.update(extra)
    return env


def run_launcher(args, env=None, timeout=60):
    return subprocess.run([sys.executable, TUTTIRUN] + args, capture_output=True, text=True,
                          env=clean_environ() if env is None else env, timeout=timeout)


class FlagMappingTest(unittest.TestCase):
    # (flags, variable, expected value): every tuning flag and the TUTTI_* variable it sets.
    CASES = [
        (["--fusion-threshold-mb", "8"], "TUTTI_FUSION_THRESHOLD", "8388608"),
        (["--fusion-threshold-mb", "0"], "TUTTI_FUSION_THRESHOLD", "0"),
        (["--fusion-threshold-mb", "0.5"], "TUTTI_FUSION_THRESHOLD", "524288"),
        # 1e-7 MB = 0.105 bytes: a positive threshold is at least 1 byte, as 0 turns fusion off.
        (["--fusion-threshold-mb", "0.0000001"], "TUTTI_FUSION_THRESHOLD", "1"),
        (["--fusion-threshold-mb", "0.000002"], "TUTTI_FUSION_THRESHOLD", "2"),  # 2.097 bytes
        (["--cycle-time-ms", "2.5"], "TUTTI_CYCLE_TIME", "2.5"),
        (["--cycle-time-ms", "3"], "TUTTI_CYCLE_TIME", "3"),
        (["--cache-capacity", "2048"], "TUTTI_CACHE_CAPACITY", "2048"),
        (["--hierarchical-allreduce"], "TUTTI_HIERARCHICAL_ALLREDUCE", "1"),
        (["--no-hierarchical-allreduce"], "TUTTI_HIERARCHICAL_ALLREDUCE", "0"),
        (["--hierarchical-allgather"], "TUTTI_HIERARCHICAL_ALLGATHER", "1"),
        (["--no-hierarchical-allgather"], "TUTTI_HIERARCHICAL_ALLGATHER", "0"),
        (["--autotune"], "TUTTI_AUTOTUNE", "1"),
        (["--no-autotune"], "TUTTI_AUTOTUNE", "0"),
        (["--autotune-log-file", "/tmp/at.csv"], "TUTTI_AUTOTUNE_LOG", "/tmp/at.csv"),
        (["--autotune-warmup-samples", "5"], "TUTTI_AUTOTUNE_WARMUP_SAMPLES", "5"),
        (["--autotune-steps-per-sample", "12"], "TUTTI_AUTOTUNE_STEPS_PER_SAMPLE", "12"),
        (["--autotune-bayes-opt-max-samples", "30"], "TUTTI_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
         "30"),
        (["--timeline-filename", "/tmp/t.json"], "TUTTI_TIMELINE", "/tmp/t.json"),
        (["--timeline-mark-cycles"], "TUTTI_TIMELINE_MARK_CYCLES", "1"),
        (["--no-stall-check"], "TUTTI_STALL_CHECK_DISABLE", "1"),
        (["--stall-check"], "TUTTI_STALL_CHECK_DISABLE", "0"),
        (["--stall-check-warning-time-seconds", "30"], "TUTTI_STALL_CHECK_TIME_SECONDS", "30"),
        (["--stall-check-shutdown-time-seconds", "120"], "TUTTI_STALL_SHUTDOWN_TIME_SECONDS",
         "120"),
        (["--log-level", "DEBUG"], "TUTTI_LOG_LEVEL", "DEBUG"),
        (["--log-level", "trace"], "TUTTI_LOG_LEVEL", "TRACE"),
        (["--log-hide-timestamp"], "TUTTI_LOG_HIDE_TIME", "1"),
        (["--log-without-timestamp"], "TUTTI_LOG_HIDE_TIME", "1"),
        (["--num-nccl-streams", "4"], "TUTTI_NUM_NCCL_STREAMS", "4"),
        (["--thread-affinity", "3"], "TUTTI_THREAD_AFFINITY", "3"),
        (["--thread-affinity", "0,8"], "TUTTI_THREAD_AFFINITY", "0,8"),
        (["--start-timeout", "45"], "TUTTI_START_TIMEOUT", "45"),
        (["--network-timeout", "12"], "TUTTI_NETWORK_TIMEOUT", "12"),
    ]

    def test_each_flag_sets_its_variable_and_exports_it(self):
        for flags, variable, value in self.CASES:
            with self.subTest(flags=flags):
                command, env = build(["-np", "2"] + flags + ["prog"])
                self.assertEqual(env.get(variable), value)
                self.assertEqual(exported(command), [variable, "PATH"])
                self.assertEqual(command[-1], "prog")

    def test_no_flags_set_no_variables(self):
        command, env = build(["-np", "2", "prog"])
        self.assertEqual(env, BASE_ENV)
        self.assertEqual(exported(command), ["PATH"])

    def test_start_timeout_adds_no_mpirun_option(self):
        plain, _ = build(["-np", "2", "prog"])
        timed, _ = build(["-np", "2", "--start-timeout", "45", "prog"])
        pair = timed.index("TUTTI_START_TIMEOUT") - 1
        self.assertEqual(timed[pair], "-x")
        self.assertEqual(timed[:pair] + timed[pair + 2:], plain)

    def test_flag_overrides_the_callers_variable(self):
        command, env = build(["-np", "2", "--cycle-time-ms", "5", "prog"],
                             environ={"TUTTI_CYCLE_TIME": "3"})
        self.assertEqual(env["TUTTI_CYCLE_TIME"], "5")
        self.assertEqual(exported(command), ["TUTTI_CYCLE_TIME"])

    def test_callers_environment_is_not_modified(self):
        environ = {"PATH": "/bin"}
        tuttirun.build_command(parse(["-np", "2", "--autotune", "prog"]), environ, 4, True)
        self.assertEqual(environ, {"PATH": "/bin"})

    def test_bad_values_are_usage_errors(self):
        for flags in (["--fusion-threshold-mb", "abc"], ["--fusion-threshold-mb", "-1"],
                      ["--fusion-threshold-mb", "inf"], ["--cycle-time-ms", "x"],
                      ["--cache-capacity", "1.5"], ["--num-nccl-streams", "0"],
                      ["--log-level", "LOUD"], ["--thread-affinity", "a,b"],
                      ["--start-timeout", "0"], ["--start-timeout", "soon"],
                      ["--autotune-gaussian-process-noise", "1000.5"],
                      ["--stall-check-warning-time-seconds", "-3"],
                      ["--hierarchical-allreduce", "--no-hierarchical-allreduce"]):
            with self.subTest(flags=flags):
                with self.assertRaises(SystemExit) as raised:
                    parse(["-np", "2"] + flags + ["prog"])
                self.assertEqual(raised.exception.code, 2)

    # Issue 11: values the runtime rejects in init() (every rank exiting 7) are refused here,
    # with the ranges of src/common/knobs.def: fusion 0 … 2^40 bytes = 1048576 MB, stall
    # warning 0.001 … 10^6 s, cycle time 0 … 10^4 ms, cache 0 … 2^30, NCCL streams 1 … 64.
    OUT_OF_RANGE = [
        (["--fusion-threshold-mb", "9000000000000"], "between 0 and 1048576"),
        (["--fusion-threshold-mb", "1e300"], "between 0 and 1048576"),
        (["--fusion-threshold-mb", "1048576.5"], "between 0 and 1048576"),
        (["--stall-check-warning-time-seconds", "0"], "between 0.001 and 1000000"),
        (["--stall-check-shutdown-time-seconds", "1000001"], "between 0 and 1000000"),
        (["--cycle-time-ms", "10001"], "between 0 and 10000"),
        (["--cache-capacity", "1073741825"], "between 0 and 1073741824"),
        (["--num-nccl-streams", "65"], "between 1 and 64"),
        (["--autotune-warmup-samples", "1001"], "between 0 and 1000"),
        (["--autotune-steps-per-sample", "100001"], "between 1 and 100000"),
        (["--autotune-bayes-opt-max-samples", "1001"], "between 1 and 1000"),
        (["--start-timeout", "0.0001"], "between 0.001 and 1000000"),
        (["--network-timeout", "3"], "between 4 and 86400"),
    ]

    def test_out_of_range_values_are_usage_errors_naming_flag_and_range(self):
        for flags, message in self.OUT_OF_RANGE:
            with self.subTest(flags=flags):
                result = run_launcher(["-np", "2", "--dry-run"] + flags + ["true"])
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f"argument {flags[0]}: '{flags[1]}' must be {message}",
                              result.stderr)

    def test_gaussian_process_noise_is_refused_with_the_reason(self):
        # Issue 12: the autotuner fits no Gaussian process, so the flag would set a knob that
        # init() refuses; the launcher says why before the job starts.
        result = run_launcher(["-np", "2", "--dry-run", "--autotune",
                               "--autotune-gaussian-process-noise", "0.8", "true"])
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("argument --autotune-gaussian-process-noise: is not used", result.stderr)
        self.assertIn("fits no Gaussian process", result.stderr)

    def test_range_ends_are_accepted(self):
        for flags, variable, value in (
                (["--fusion-threshold-mb", "1048576"], "TUTTI_FUSION_THRESHOLD",
                 str(2**40)),
                (["--stall-check-warning-time-seconds", "0.001"],
                 "TUTTI_STALL_CHECK_TIME_SECONDS", "0.001"),
                (["--num-nccl-streams", "64"], "TUTTI_NUM_NCCL_STREAMS", "64"),
                (["--cache-capacity", "1073741824"], "TUTTI_CACHE_CAPACITY", str(2**30))):
            with self.subTest(flags=flags):
                _, env = build(["-np", "2"] + flags + ["prog"])
                self.assertEqual(env[variable], value)

    def test_ranges_come_from_knobs_def(self):
        knobs = {knob.name: knob for knob in tuttirun.knobs.load()}
        self.assertEqual(tuttirun.flag_range("--cycle-time-ms"),
                         (knobs["CYCLE_TIME"].min, knobs["CYCLE_TIME"].max))


class HostsTest(unittest.TestCase):
    def test_parse_hosts(self):
        self.assertEqual(tuttirun.parse_hosts("a:2,b:3"), [("a", 2), ("b", 3)])
        self.assertEqual(tuttirun.parse_hosts("a"), [("a", 1)])
        self.assertEqual(tuttirun.parse_hosts("a,b:4"), [("a", 1), ("b", 4)])
        self.assertEqual(tuttirun.parse_hosts("a,a,b"), [("a", 2), ("b", 1)])
        self.assertEqual(tuttirun.parse_hosts("10.0.0.1:8"), [("10.0.0.1", 8)])

    def test_malformed_hosts(self):
        for text in ("host:abc", "host:0", "host:-1", "host:", ":2", "a,,b", "", "a b:2"):
            with self.subTest(text=text):
                with self.assertRaises(ValueError):
                    tuttirun.parse_hosts(text)

    def test_an_ipv6_address_is_refused_not_misread(self):
        # '::1' was read as host ':' with 1 slot, a remote host (mpirun's -H takes no IPv6).
        for text in ("::1", "fe80::1", "[::1]:2", "a:1,::1:2"):
            with self.subTest(text=text):
                with self.assertRaises(ValueError) as caught:
                    tuttirun.parse_hosts(text)
                self.assertIn("is an IPv6 address, which mpirun's -H cannot take",
                              str(caught.exception))

    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(text)
        f.close()
        return f.name

    def test_parse_hostfile(self):
        path = self.write("# the cluster\n\nnode1 slots=4\n  node2   slots = 2  # spare\n"
                          "node3 slots=1 max_slots=2\n")
        self.assertEqual(tuttirun.parse_hostfile(path), [("node1", 4), ("node2", 2), ("node3", 1)])

    def test_malformed_hostfiles(self):
        for text in ("node1\n", "node1 slots=x\n", "node1 slots=0\n", "node1 slots=2 extra\n",
                     "node1 cores=2\n", "# only a comment\n\n"):
            with self.subTest(text=text):
                with self.assertRaisesRegex(ValueError, "hostfile|malformed"):
                    tuttirun.parse_hostfile(self.write(text))

    def test_malformed_line_is_named(self):
        path = self.write("node1 slots=2\nnode2 slots=two\n")
        with self.assertRaisesRegex(ValueError, re.escape(path) + ":2: malformed"):
            tuttirun.parse_hostfile(path)

    def test_max_slots_below_slots_is_refused_naming_the_line(self):
        # mpirun refuses such a line with an "internal error" after starting.
        path = self.write("node1 slots=4\nnode2 slots=2 max_slots=1\n")
        with self.assertRaisesRegex(ValueError, re.escape(
                f"{path}:2: max_slots=1 is below slots=2 in 'node2 slots=2 max_slots=1'")):
            tuttirun.parse_hostfile(path)
        path = self.write("node1 slots=2 max_slots=2\n")
        self.assertEqual(tuttirun.parse_hostfile(path), [("node1", 2)])

    def test_a_host_on_several_lines_reaches_mpirun_merged(self):
        # mpirun refuses a host on two 'slots=' lines; tuttirun hands it what it checked, as a
        # merged copy that main() writes (merged_hostfile) in place of MERGED_HOSTFILE.
        path = self.write("a slots=2\nb slots=1\na slots=1\n")
        args = parse(["-np", "4", "--hostfile", path, "prog"])
        self.assertEqual(args.hostfile_hosts, [("a", 3, None), ("b", 1, None)])
        command, _ = tuttirun.build_command(args, dict(BASE_ENV), 1, False)
        self.assertEqual(command[command.index("--hostfile") + 1], tuttirun.MERGED_HOSTFILE)
        self.assertNotIn("-H", command)

    def test_merging_keeps_the_max_slots_of_the_other_hosts(self):
        # A tester's report: node2's max_slots vanished when node1's lines were merged, since
        # the merged list reached mpirun as -H, which has no max_slots.
        path = self.write("node1 slots=2\nnode2 slots=2 max_slots=4\nnode1 slots=1\n")
        args = parse(["-np", "3", "--hostfile", path, "prog"])
        self.assertTrue(args.hostfile_merged)
        self.assertEqual(args.hostfile_hosts, [("node1", 3, None), ("node2", 2, 4)])
        self.assertEqual(tuttirun.hostfile_text(args.hostfile_hosts, path).splitlines()[1:],
                         ["node1 slots=3", "node2 slots=2 max_slots=4"])

    def test_a_repeated_host_with_max_slots_on_every_line_gets_their_sum(self):
        path = self.write("a slots=2 max_slots=4\nb slots=1 max_slots=2\na slots=1 max_slots=1\n")
        self.assertEqual(tuttirun.merge_hostfile(path, tuttirun.read_hostfile(path)),
                         [("a", 3, 5), ("b", 1, 2)])

    def test_a_repeated_host_with_max_slots_on_some_lines_is_refused(self):
        path = self.write("a slots=2 max_slots=4\nb slots=1\na slots=1\n")
        with self.assertRaisesRegex(ValueError, re.escape(
                f"{path}:1: host 'a' has max_slots here but not on line(s) 3: its lines are "
                "merged into one, so give max_slots on all of them or on none")):
            tuttirun.parse_hostfile(path)

    def test_this_machine_under_two_names_is_merged_as_one_host(self):
        # mpirun takes 'localhost' and the hostname for one node, and refuses a file naming
        # both ("multiple definitions of the slot count", then an internal error).
        me = socket.gethostname()
        path = self.write(f"localhost slots=2\nnode2 slots=1\n{me} slots=1\n")
        args = parse(["-np", "4", "--hostfile", path, "prog"])
        self.assertTrue(args.hostfile_merged)
        self.assertEqual(args.hostfile_hosts, [("localhost", 3, None), ("node2", 1, None)])
        path = self.write(f"{me} slots=1 max_slots=2\n127.0.0.1 slots=1\n")
        with self.assertRaisesRegex(ValueError, re.escape(
                f"{path}:1: this machine ('127.0.0.1', '{me}') has max_slots here but not on "
                "line(s) 2")):
            tuttirun.parse_hostfile(path)

    def test_the_merged_hostfile_lives_for_the_block(self):
        path = self.write("a slots=2\nb slots=2 max_slots=3\na slots=1\n")
        args = parse(["-np", "4", "--hostfile", path, "prog"])
        with tuttirun.merged_hostfile(args):
            merged = args.mpirun_hostfile
            self.assertNotEqual(merged, tuttirun.MERGED_HOSTFILE)
            with open(merged, encoding="utf-8") as f:
                self.assertEqual(f.read().splitlines()[1:], ["a slots=3", "b slots=2 max_slots=3"])
        self.assertFalse(os.path.exists(merged))
        # Also when the launch fails.
        with self.assertRaises(RuntimeError):
            with tuttirun.merged_hostfile(args):
                merged = args.mpirun_hostfile
                raise RuntimeError("mpirun could not start")
        self.assertFalse(os.path.exists(merged))
        # A hostfile without a repeated host reaches mpirun as it is.
        path = self.write("a slots=2\nb slots=2 max_slots=3\n")
        args = parse(["-np", "4", "--hostfile", path, "prog"])
        with tuttirun.merged_hostfile(args):
            self.assertEqual(args.mpirun_hostfile, path)

    def test_missing_hostfile(self):
        with self.assertRaisesRegex(ValueError, "cannot read hostfile"):
            tuttirun.parse_hostfile("/nonexistent/hosts")

    def test_hosts_pass_to_mpirun(self):
        command, _ = build(["-np", "5", "-H", "a:2,b:3", "prog"], cpu_count=1)
        self.assertEqual(command[command.index("-H") + 1], "a:2,b:3")
        self.assertNotIn("--oversubscribe", command)
        command, _ = build(["-np", "2", "-H", "a,b", "prog"])
        self.assertEqual(command[command.index("-H") + 1], "a:1,b:1")

    def test_hostfile_passes_to_mpirun(self):
        path = self.write("a slots=2\nb slots=2\n")
        command, _ = build(["-np", "4", "--hostfile", path, "prog"], cpu_count=1)
        self.assertEqual(command[command.index("--hostfile") + 1], path)
        self.assertNotIn("-H", command)
        self.assertNotIn("--oversubscribe", command)


def keepalive(command):
    """{param: value} of the oob_tcp_keepalive_* MCA settings in an mpirun command."""
    return {command[i + 1]: command[i + 2] for i, arg in enumerate(command)
            if arg == "--mca" and command[i + 1].startswith("oob_tcp_keepalive")}


class NetworkFailureTest(unittest.TestCase):
    """Issue 17: jobs on several hosts end a bounded time after a host is lost, and tuttirun
    names the host."""

    def test_host_jobs_bound_the_wait_for_a_lost_host(self):
        command, _ = build(["-np", "4", "-H", "a:2,b:2", "prog"])
        # The default TUTTI_NETWORK_TIMEOUT of 30 s: 15 s idle, then 3 probes 5 s apart.
        self.assertEqual(keepalive(command), {"oob_tcp_keepalive_time": "15",
                                              "oob_tcp_keepalive_intvl": "5",
                                              "oob_tcp_keepalive_probes": "3"})
        command, _ = build(["-np", "4", "-H", "a:2,b:2", "--network-timeout", "6", "prog"])
        self.assertEqual(keepalive(command), {"oob_tcp_keepalive_time": "3",
                                              "oob_tcp_keepalive_intvl": "1",
                                              "oob_tcp_keepalive_probes": "3"})
        command, _ = build(["-np", "4", "-H", "a:2,b:2", "prog"],
                           environ=dict(BASE_ENV, TUTTI_NETWORK_TIMEOUT="6"))
        self.assertEqual(keepalive(command)["oob_tcp_keepalive_time"], "3")

    def test_keepalive_adds_up_to_the_timeout(self):
        for timeout in list(range(4, 100)) + [86400]:
            idle, interval, probes = tuttirun.keepalive_settings(timeout)
            self.assertEqual(idle + interval * probes, timeout)
            self.assertGreaterEqual(min(idle, interval), 1)

    def test_local_jobs_and_the_callers_own_settings_are_left_alone(self):
        command, _ = build(["-np", "2", "prog"])
        self.assertEqual(keepalive(command), {})
        command, _ = build(["-np", "4", "-H", "a:2,b:2",
                            "--mpi-args=--mca oob_tcp_keepalive_time 60", "prog"])
        self.assertEqual(keepalive(command), {"oob_tcp_keepalive_time": "60"})
        command, _ = build(["-np", "4", "-H", "a:2,b:2", "prog"],
                           environ=dict(BASE_ENV, OMPI_MCA_oob_tcp_keepalive_probes="9"))
        self.assertEqual(keepalive(command), {})

    def test_a_bad_network_timeout_variable_is_a_usage_error(self):
        result = run_launcher(["-np", "2", "--dry-run", "-H", "a,b", "true"],
                              env=clean_environ(TUTTI_NETWORK_TIMEOUT="soon"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("TUTTI_NETWORK_TIMEOUT: 'soon' is not an integer", result.stderr)
        # As init() reads knobs: set but empty, spaces or '+' are refused, not taken or skipped.
        for value in ("", " 12", "+12", "12 ", "1_2"):
            with self.subTest(value=value):
                result = run_launcher(["-np", "2", "--dry-run", "-H", "a,b", "true"],
                                      env=clean_environ(TUTTI_NETWORK_TIMEOUT=value))
                self.assertEqual(result.returncode, 2)
                self.assertIn(f"TUTTI_NETWORK_TIMEOUT: '{value}' is not an integer",
                              result.stderr)
        # A launcher knob, which init() never reads: the HOROVOD_ spelling is checked here too.
        for value, message in (("30s", "'30s' is not an integer"),
                               ("3", "'3' must be between 4 and 86400")):
            with self.subTest(value=value):
                result = run_launcher(["-np", "2", "--dry-run", "-H", "a,b", "true"],
                                      env=clean_environ(HOROVOD_NETWORK_TIMEOUT=value))
                self.assertEqual(result.returncode, 2)
                self.assertIn(f"HOROVOD_NETWORK_TIMEOUT: {message}", result.stderr)

    def scan(self, text, returncode=205):
        scanner = tuttirun.HostFailureScanner()
        for line in text.splitlines():
            scanner.feed_line(line)
        return scanner.report(returncode)

    # Open MPI 4.1's own wording (help-errmgr-base.txt, help-orterun.txt).
    LOST_DAEMON = """\
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[9425,0],0] on node vm
  Remote daemon: [[9425,0],2] on node tnode1

This is usually due to either a failure of the TCP network
"""
    KILLED = ("mpirun noticed that process rank 2 with PID 0 on node tnode1 exited on signal 9 "
              "(Killed).\n")
    ABORTED = """\
mpirun has exited due to process rank 3 with PID 1234 on
node tnode1 calling "abort". This may have caused other processes
"""

    def test_the_report_names_the_lost_host(self):
        self.assertEqual(self.scan(self.LOST_DAEMON),
                         "tuttirun: the job failed (exit status 205): host tnode1: lost contact "
                         "with the host (it crashed, or its network failed)")
        self.assertEqual(self.scan(self.KILLED, 137),
                         "tuttirun: the job failed (exit status 137): host tnode1: rank 2 was "
                         "killed by signal 9 (Killed)")
        self.assertEqual(self.scan(self.ABORTED, 1),
                         "tuttirun: the job failed (exit status 1): host tnode1: rank 3 aborted "
                         "the job")

    def test_no_report_without_a_failure_or_a_host(self):
        self.assertIsNone(self.scan(self.LOST_DAEMON, returncode=0))
        self.assertIsNone(self.scan("[1,0]<stderr>:some error\n", returncode=1))


class RelayTest(unittest.TestCase):
    def test_a_sink_that_fails_stops_the_copies_not_the_reading(self):
        class Gone(io.RawIOBase):
            def writable(self):
                return True

            def write(self, data):
                raise BrokenPipeError(32, "Broken pipe")

        class Lines:
            def __init__(self):
                self.lines = []

            def feed_line(self, line):
                self.lines.append(line)

        read_end, write_end = os.pipe()
        lines = [f"line {i} " + "x" * 60 for i in range(3000)]  # About 200 KB.
        writer = threading.Thread(target=lambda: (os.write(write_end, (
            "\n".join(lines) + "\n").encode()), os.close(write_end)))
        writer.start()
        scanner = Lines()
        with os.fdopen(read_end, "rb") as source:
            tuttirun._relay(source, Gone(), scanner)  # Returns at the end of the pipe.
        writer.join()
        self.assertEqual(scanner.lines, lines)


class CommandTest(unittest.TestCase):
    def test_plain_local_command(self):
        command, env = build(["-np", "2", "prog", "a", "b"], cpu_count=4)
        self.assertEqual(command, ["mpirun", "--tag-output", "-np", "2"] + DEFAULT_BINDING +
                         ["-x", "PATH", "prog", "a", "b"])
        self.assertEqual(env, BASE_ENV)

    def test_root(self):
        command, env = build(["-np", "2", "prog"], cpu_count=4, is_root=True)
        self.assertEqual(command[:3], ["mpirun", "--allow-run-as-root", "--tag-output"])
        self.assertEqual(env["OMPI_ALLOW_RUN_AS_ROOT"], "1")
        self.assertEqual(env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"], "1")
        command, env = build(["-np", "2", "prog"], cpu_count=4, is_root=False)
        self.assertNotIn("--allow-run-as-root", command)
        self.assertNotIn("OMPI_ALLOW_RUN_AS_ROOT", env)

    def test_oversubscribe_when_ranks_outnumber_local_cores(self):
        self.assertNotIn("--oversubscribe", build(["-np", "4", "prog"], cpu_count=4)[0])
        self.assertIn("--oversubscribe", build(["-np", "5", "prog"], cpu_count=4)[0])

    def test_mpiruns_own_oversubscription_is_recognised(self):
        # Only '--oversubscribe' was: '-np 3 -H localhost:1' was refused with these.
        for mpi_args in (["--oversubscribe"], ["-oversubscribe"],
                         ["--map-by", "slot:OVERSUBSCRIBE"], ["--map-by=core:PE=1,oversubscribe"],
                         ["--mca", "rmaps_base_oversubscribe", "1"]):
            with self.subTest(mpi_args=mpi_args):
                self.assertTrue(tuttirun.oversubscribes(mpi_args, {}))
        self.assertTrue(tuttirun.oversubscribes([], {"OMPI_MCA_rmaps_base_oversubscribe": "true"}))
        for mpi_args, environ in ((["--map-by", "slot"], {}),
                                  (["--mca", "rmaps_base_oversubscribe", "0"], {}),
                                  ([], {"OMPI_MCA_rmaps_base_oversubscribe": "0"}), ([], {})):
            with self.subTest(mpi_args=mpi_args, environ=environ):
                self.assertFalse(tuttirun.oversubscribes(mpi_args, environ))
        command, _ = build(["-np", "3", "-H", "localhost:1", "--binding-args",
                            "--map-by slot:OVERSUBSCRIBE", "prog"])
        self.assertIn("-np", command)

    def test_ranks_beyond_host_slots(self):
        with self.assertRaises(SystemExit) as raised:
            parse(["-np", "6", "-H", "a:2,b:3", "prog"])
        self.assertEqual(raised.exception.code, 2)
        command, _ = build(["-np", "6", "-H", "a:2,b:3", "--mpi-args=--oversubscribe", "prog"])
        self.assertEqual(command.count("--oversubscribe"), 1)

    def test_the_environment_is_exported_as_horovodrun_does(self):
        # Ranks on other hosts get only the variables named by -x (ssh gives their daemons a
        # bare environment). Before, only TUTTI_*, HOROVOD_*, LD_LIBRARY_PATH and PATH went, so
        # OMP_NUM_THREADS or NCCL_* set for the job stopped at the first host.
        environ = {"TUTTI_CYCLE_TIME": "3", "HOROVOD_FUSION_THRESHOLD": "1", "OTHER": "x",
                   "LD_LIBRARY_PATH": "/l", "PATH": "/p", "MY_TUTTI_X": "y",
                   "OMP_NUM_THREADS": "4", "NCCL_SOCKET_IFNAME": "eth0"}
        command, env = build(["-np", "2", "--autotune", "prog"], environ=environ)
        self.assertEqual(exported(command), ["HOROVOD_FUSION_THRESHOLD", "TUTTI_AUTOTUNE",
                                             "TUTTI_CYCLE_TIME", "LD_LIBRARY_PATH", "MY_TUTTI_X",
                                             "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "OTHER",
                                             "PATH"])
        self.assertEqual(env["OTHER"], "x")

    def test_the_shells_and_the_mpi_launchers_own_variables_are_not_exported(self):
        kept = {"PATH": "/p", "SSHX": "1", "OMPI": "1", "PWDX": "1", "X_PWD": "1"}
        left = {"BASH_FUNC_f%%": "() { :; }", "OLDPWD": "/o", "PWD": "/w", "SHLVL": "2",
                "_": "/usr/bin/python3", "HOSTNAME": "h", "SSH_CONNECTION": "a b",
                "SSH_AUTH_SOCK": "/s", "OMPI_MCA_btl": "self", "OMPI_COMM_WORLD_RANK": "0",
                "PMIX_RANK": "0", "PMI_RANK": "0", "PRTE_MCA_x": "1", "ORTE_X": "1",
                "OPAL_PREFIX": "/o"}
        command, env = build(["-np", "2", "prog"], environ={**kept, **left}, is_root=True)
        self.assertEqual(exported(command), sorted(kept))
        self.assertEqual(env["OMPI_MCA_btl"], "self")  # mpirun itself still reads it.

    def test_no_path_no_export(self):
        command, _ = build(["-np", "2", "prog"], environ={})
        self.assertEqual(exported(command), [])

    def test_mpi_args_are_split_and_inserted_before_the_program(self):
        command, _ = build(["-np", "2", "--mpi-args=--mca btl 'tcp,self' -x FOO=a\\ b",
                            "prog", "x"], cpu_count=4)
        self.assertEqual(command[-8:], ["PATH", "--mca", "btl", "tcp,self", "-x", "FOO=a b",
                                        "prog", "x"])

    def test_binding_args_replace_the_default(self):
        command, _ = build(["-np", "2", "--binding-args=--bind-to core --map-by socket", "prog"])
        self.assertNotIn("none", command)
        start = command.index("--bind-to")
        self.assertEqual(command[start:start + 4], ["--bind-to", "core", "--map-by", "socket"])

    def test_output_filename_and_ssh(self):
        command, _ = build(["-np", "2", "-H", "a:2", "--output-filename", "/tmp/out", "-p", "2222",
                            "-i", "/k/id", "prog"])
        self.assertEqual(command[command.index("--output-filename") + 1], "/tmp/out")
        start = command.index("plm_rsh_args") - 1
        self.assertEqual(command[start:start + 3], ["--mca", "plm_rsh_args", "-p 2222 -i /k/id"])

    def test_program_arguments_pass_through_untouched(self):
        command, _ = build(["-np", "2", "prog", "--verbose", "-np", "7", "a b", "--"])
        self.assertEqual(command[-6:], ["prog", "--verbose", "-np", "7", "a b", "--"])
        command, _ = build(["-np", "2", "--", "prog", "-x"])
        self.assertEqual(command[-2:], ["prog", "-x"])

    def test_format_command_shows_what_the_launcher_set(self):
        environ = {"PATH": "/p", "TUTTI_LOG_LEVEL": "INFO"}
        command, env = tuttirun.build_command(
            parse(["-np", "2", "--cache-capacity", "0", "prog", "a b"]), environ, 4, True)
        self.assertEqual(
            tuttirun.format_command(command, env, environ),
            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TUTTI_CACHE_CAPACITY=0 "
            "mpirun --allow-run-as-root --tag-output -np 2 --bind-to none --map-by slot "
            "-x TUTTI_CACHE_CAPACITY -x TUTTI_LOG_LEVEL -x PATH prog 'a b'")

    def test_local_job(self):
        self.assertTrue(tuttirun.is_local_job(None))
        self.assertTrue(tuttirun.is_local_job([("localhost", 2)]))
        self.assertFalse(tuttirun.is_local_job([("localhost", 2), ("node7", 2)]))

    def test_version_from_meson_build(self):
        with tempfile.TemporaryDirectory() as repo:
            self.assertEqual(tuttirun.read_version(repo), "0.1.0")  # No meson.build: default.
            with open(os.path.join(repo, "meson.build"), "w", encoding="utf-8") as f:
                f.write("project('tutti', 'cpp', version: '9.8.7', meson_version: '>=1.0.1')\n")
            self.assertEqual(tuttirun.read_version(repo), "9.8.7")


class ErrorTest(unittest.TestCase):
    def assert_usage_error(self, args, message, env=None):
        result = run_launcher(args, env=env)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertIn("usage: tuttirun", result.stderr)
        self.assertIn(message, result.stderr)

    def test_no_arguments(self):
        self.assert_usage_error([], "required: -np/--num-proc")

    def test_bad_np(self):
        self.assert_usage_error(["-np", "0", "true"], "'0' must be between 1 and 2147483647")
        self.assert_usage_error(["-np", "x", "true"], "'x' is not an integer")
        # Issue 11: this reached mpirun, which read it as -1. MPI counts ranks in an int.
        self.assert_usage_error(["-np", "99999999999999999999", "true"],
                                "argument -np/--num-proc: '99999999999999999999' must be "
                                "between 1 and 2147483647")
        self.assert_usage_error(["-np", "2", "-p", "65536", "true"],
                                "'65536' must be between 1 and 65535")
        # Integers as init() reads integer knobs: exact ones with an exponent are taken, the
        # rest refused as not integers.
        for value in ("1.5", "inf", "nan", "0x10", "1e100", "\u0661\u0662"):
            with self.subTest(value=value):
                self.assert_usage_error(["-np", value, "true"], f"'{value}' is not an integer")

    def test_integers_may_be_written_with_an_exponent(self):
        command, env = build(["-np", "2e0", "--cache-capacity", "1e3", "--network-timeout",
                              "30.0", "-H", "a,b", "prog"])
        self.assertEqual(command[command.index("-np") + 1], "2")
        self.assertEqual(env["TUTTI_CACHE_CAPACITY"], "1000")
        self.assertEqual(env["TUTTI_NETWORK_TIMEOUT"], "30")

    def test_no_program(self):
        self.assert_usage_error(["-np", "2"], "no program given")

    def test_hosts_and_hostfile_conflict(self):
        self.assert_usage_error(["-np", "2", "-H", "a:2", "--hostfile", "/etc/hosts", "true"],
                                "not allowed with argument")

    def test_bad_hosts(self):
        self.assert_usage_error(["-np", "2", "-H", "a:0", "true"], "malformed -H entry 'a:0'")
        self.assert_usage_error(["-np", "2", "-H", "host:abc", "true"], "malformed -H entry")
        self.assert_usage_error(["-np", "4", "-H", "a:1,b:2", "true"],
                                "-np 4 exceeds the 3 slots")
        self.assert_usage_error(["-np", "2", "--hostfile", "/nonexistent/hosts", "true"],
                                "cannot read hostfile")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hosts")
            with open(path, "w", encoding="utf-8") as f:
                f.write("localhost slots=2 max_slots=1\n")
            self.assert_usage_error(["-np", "2", "--hostfile", path, "true"],
                                    f"{path}:1: max_slots=1 is below slots=2")

    def test_elastic_bounds_name_the_flags_given(self):
        # A tester's report: this said '--max-np 2 is below --min-np 4', a flag never given.
        def error(argv):
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as caught:
                tuttirun.parse_args(["--host-discovery-script", "d"] + argv + ["prog"])
            self.assertEqual(caught.exception.code, 2)
            return stderr.getvalue().splitlines()[-1]

        self.assertEqual(error(["-np", "4", "--max-np", "2"]),
                         "tuttirun: error: --max-np 2 is below -np 4 (the default --min-np)")
        self.assertEqual(error(["--min-np", "4", "--max-np", "2"]),
                         "tuttirun: error: --max-np 2 is below --min-np 4")
        self.assertEqual(error(["-np", "2", "--min-np", "4"]),  # Said '.. --max-np None'.
                         "tuttirun: error: -np 2 is below --min-np 4")

    def test_outside_a_source_checkout_one_line_names_the_missing_file(self):
        # A tester's report: a copy of scripts/ elsewhere ended every command, --help included,
        # with a FileNotFoundError traceback for ../src/common/knobs.def.
        scripts = os.path.dirname(TUTTIRUN)
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "scripts")
            os.mkdir(copy)
            shutil.copy(TUTTIRUN, os.path.join(copy, "tuttirun"))
            result = subprocess.run([sys.executable, os.path.join(copy, "tuttirun"), "--help"],
                                    capture_output=True, text=True, env=clean_environ(),
                                    timeout=60)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertEqual(result.stderr, f"tuttirun: error: {copy}/elastic_driver.py not "
                             "found: tuttirun runs from a Tutti source checkout "
                             "(scripts/tuttirun), not copied out of one\n")
            for name in ("elastic_driver.py", "knobs.py"):
                shutil.copy(os.path.join(scripts, name), copy)
            result = subprocess.run([sys.executable, os.path.join(copy, "tuttirun"), "--help"],
                                    capture_output=True, text=True, env=clean_environ(),
                                    timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr, f"tuttirun: error: {tmp}/src/common/knobs.def not found: "
                         "tuttirun runs from a Tutti source checkout (scripts/tuttirun), not "
                         "copied out of one\n")

    def test_knobs_init_refuses_together_are_usage_errors(self):
        # Each was exported, and then every rank's init() refused it (the job ended in aborts).
        for flags, message in (
                (["--autotune-log-file", "/tmp/a.csv"],
                 "--autotune-log-file needs --autotune (TUTTI_AUTOTUNE=1)"),
                (["--autotune-warmup-samples", "2"],
                 "--autotune-warmup-samples needs --autotune"),
                (["--timeline-mark-cycles"],
                 "--timeline-mark-cycles needs --timeline-filename (TUTTI_TIMELINE)"),
                (["--no-stall-check", "--stall-check-warning-time-seconds", "5"],
                 "--stall-check-warning-time-seconds is a limit of the stall inspector, which "
                 "--no-stall-check turns off")):
            with self.subTest(flags=flags):
                self.assert_usage_error(["-np", "2", "--dry-run"] + flags + ["true"], message)
        # Set in the environment, named as such; HOROVOD_ spellings count.
        self.assert_usage_error(
            ["-np", "2", "--dry-run", "--stall-check-shutdown-time-seconds", "9", "true"],
            "which HOROVOD_STALL_CHECK_DISABLE (environment) turns off",
            env=clean_environ(HOROVOD_STALL_CHECK_DISABLE="yes"))
        self.assert_usage_error(["-np", "2", "--dry-run", "true"],
                                "TUTTI_ELASTIC_KEEP (environment) needs TUTTI_ELASTIC_DIR",
                                env=clean_environ(TUTTI_ELASTIC_KEEP="3"))
        # What init() accepts passes.
        for flags, env in ((["--autotune", "--autotune-log-file", "/tmp/a.csv"], {}),
                           (["--autotune-steps-per-sample", "4"], {"HOROVOD_AUTOTUNE": "1"}),
                           (["--timeline-filename", "/tmp/t.json", "--timeline-mark-cycles"], {}),
                           (["--stall-check", "--stall-check-warning-time-seconds", "5"], {}),
                           (["--no-stall-check"], {})):
            with self.subTest(flags=flags, env=env):
                result = run_launcher(["-np", "2", "--dry-run"] + flags + ["true"],
                                      env=clean_environ(**env))
                self.assertEqual(result.returncode, 0, result.stderr)

    def test_missing_program(self):
        self.assert_usage_error(["-np", "1", "no-such-program-xyz"],
                                "tuttirun: error: program 'no-such-program-xyz' not found")
        self.assert_usage_error(["-np", "1", "/nonexistent/prog"],
                                "program '/nonexistent/prog' not found")

    def test_missing_mpirun(self):
        with tempfile.TemporaryDirectory() as empty:
            self.assert_usage_error(["-np", "1", "/bin/true"], "mpirun not found",
                                    env=clean_environ(PATH=empty))

    def test_version(self):
        result = run_launcher(["-v"])
        self.assertEqual(result.returncode, 0)
        self.assertRegex(result.stdout, r"^tuttirun \d+\.\d+\.\d+\n$")


class HorovodrunFlagsTest(unittest.TestCase):
    """horovodrun's flags that tuttirun takes doing nothing, refuses with a reason, or took
    for others they begin (README, Launching jobs)."""

    def parse_error(self, argv):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as caught:
            tuttirun.parse_args(argv)
        self.assertEqual(caught.exception.code, 2)
        return stderr.getvalue().splitlines()[-1]

    def test_no_flag_stands_for_another_it_begins(self):
        # '--mpi' was taken for '--mpi-args' ("expected one argument"), '-n' for '-np' and
        # '-c' for '-cb' (Python's allow_abbrev=False lets single-dash ones through).
        args = parse(["-np", "2", "--mpi", "prog", "x"])
        self.assertIsNone(args.mpi_args)
        self.assertEqual(args.command, ["prog", "x"])
        for argv, flag in ((["-n", "2", "prog"], "-n"), (["-c"], "-c"),
                           (["-np", "2", "--mpi-arg=--oversubscribe", "prog"],
                            "--mpi-arg=--oversubscribe"),
                           (["-np", "2", "--fusion-threshold", "8", "prog"], "--fusion-threshold")):
            with self.subTest(argv=argv):
                self.assertIn(f"unrecognized arguments: {flag}", self.parse_error(argv))
        # A one-letter flag's attached value is still read.
        command, _ = build(["-np", "2", "-H", "a:2", "-p2222", "prog"])
        self.assertIn("-p 2222", command)

    def test_mpi_and_disable_cache_change_nothing(self):
        # --mpi: Tutti always runs over MPI. --disable-cache: horovodrun's cache of its ssh and
        # network-interface checks, which tuttirun does not make (not the response cache).
        plain = build(["-np", "2", "prog"])
        self.assertEqual(build(["-np", "2", "--mpi", "--disable-cache", "prog"]), plain)
        command, env = build(["-np", "2", "--disable-cache", "--cache-capacity", "64", "prog"])
        self.assertEqual(env["TUTTI_CACHE_CAPACITY"], "64")

    REFUSED = [
        (["--gloo"], "--gloo", "Tutti runs only over MPI (Open MPI's mpirun), never Gloo"),
        (["--gloo-timeout-seconds", "30"], "--gloo-timeout-seconds", "never Gloo"),
        (["--jsrun"], "--jsrun", "tuttirun launches only with Open MPI's mpirun"),
        (["--config-file", "c.yaml"], "--config-file", "reads no YAML configuration"),
        (["--network-interface", "eth0"], "--network-interface/--network-interfaces",
         "--mpi-args='--mca btl_tcp_if_include IF --mca oob_tcp_if_include IF'"),
        (["--network-interfaces", "eth0,eth1"], "--network-interface/--network-interfaces",
         "picks no network interfaces"),
        (["--tcp"], "--tcp", "--mpi-args='--mca btl tcp,self'"),
        (["--mpi-threads-disable"], "--mpi-threads-disable", "MPI_THREAD_MULTIPLE"),
        (["--prefix-output-with-timestamp"], "-prefix-timestamp/--prefix-output-with-timestamp",
         "--mpi-args=--timestamp-output"),
        (["-prefix-timestamp"], "-prefix-timestamp/--prefix-output-with-timestamp",
         "--timestamp-output"),
        (["--slots-per-host", "2"], "--slots-per-host", "the discovery script gives each host"),
        (["--reset-limit", "3"], "--reset-limit", "(--max-restarts)"),
        (["--blacklist-cooldown-range", "60", "300"], "--blacklist-cooldown-range",
         "stops listing it and lists it again"),
    ]

    def test_refused_flags_say_why(self):
        for flags, name, reason in self.REFUSED:
            with self.subTest(flags=flags):
                line = self.parse_error(["-np", "2"] + flags + ["prog"])
                self.assertTrue(line.startswith(f"tuttirun: error: argument {name}: "), line)
                self.assertIn(reason, line)
        result = run_launcher(["-np", "2", "--gloo", "--dry-run", "true"])
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        self.assertIn("usage: tuttirun", result.stderr)
        self.assertIn("argument --gloo: Tutti runs only over MPI", result.stderr)

    def test_the_help_names_the_refused_flags(self):
        result = run_launcher(["--help"])
        self.assertEqual(result.returncode, 0, result.stderr)
        text = " ".join(result.stdout.split())
        for flags, _, _ in self.REFUSED:
            with self.subTest(flag=flags[0]):
                # argparse wraps the epilog at hyphens: compare without the spaces it adds.
                self.assertIn(flags[0], text.replace("- ", "-"))


class DryRunTest(unittest.TestCase):
    def test_prints_and_runs_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "ran")
            result = run_launcher(["-np", "3", "--dry-run", "--fusion-threshold-mb", "8",
                                   "sh", "-c", f"touch {marker}"])
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertFalse(os.path.exists(marker))
        self.assertEqual(result.stdout.count("\n"), 1)
        self.assertIn("TUTTI_FUSION_THRESHOLD=8388608 ", result.stdout)
        self.assertIn(" -np 3 ", result.stdout)
        self.assertIn(" -x TUTTI_FUSION_THRESHOLD ", result.stdout)
        self.assertTrue(result.stdout.rstrip().endswith(f"sh -c 'touch {marker}'"))

    def test_remote_program_is_not_checked(self):
        result = run_launcher(["-np", "2", "-H", "node7:2", "--dry-run", "/only/on/node7"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("-H node7:2", result.stdout)

    def test_a_merged_hostfile_is_shown_not_written(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hf1")
            with open(path, "w", encoding="utf-8") as f:
                f.write("node1 slots=2\nnode2 slots=2 max_slots=4\nnode1 slots=1\n")
            scratch = os.path.join(tmp, "scratch")  # The launcher's temporary folder.
            os.mkdir(scratch)
            result = run_launcher(["-np", "3", "--hostfile", path, "--dry-run", "./prog"],
                                  env=clean_environ(TMPDIR=scratch))
            self.assertEqual(os.listdir(scratch), [])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("\n"), 1)
        self.assertIn(f" --hostfile {scratch}/tuttirun-XXXXXXXX.hostfile ", result.stdout)
        self.assertNotIn(" -H ", result.stdout)
        self.assertIn(f"{path} with each host on one line, as mpirun needs: node1 slots=3; "
                      "node2 slots=2 max_slots=4\n", result.stderr)


class CheckBuildTest(unittest.TestCase):
    def check_build(self, config_text):
        with tempfile.TemporaryDirectory() as build_dir:
            if config_text is not None:
                with open(os.path.join(build_dir, "tutti_config.h"), "w", encoding="utf-8") as f:
                    f.write(config_text)
            return run_launcher(["--check-build"], env=clean_environ(TUTTI_BUILD_DIR=build_dir))

    def test_cpu_only_build(self):
        result = self.check_build("#pragma once\n#define TUTTI_HAVE_CUDA 0\n"
                                  "#define TUTTI_HAVE_NCCL 0\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertRegex(lines[0], r"^Tutti v\d+\.\d+\.\d+:$")
        self.assertEqual(lines[3:], ["Available Frameworks:", "    [X] C++", "",
                                     "Available Controllers:", "    [X] MPI", "",
                                     "Available Tensor Operations:", "    [ ] NCCL",
                                     "    [ ] CUDA", "    [X] MPI"])

    def test_gpu_build(self):
        result = self.check_build("#define TUTTI_HAVE_CUDA 1\n\n#define TUTTI_HAVE_NCCL 1\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("    [X] NCCL\n    [X] CUDA\n    [X] MPI\n", result.stdout)

    def test_no_build(self):
        result = self.check_build(None)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        self.assertIn("no Tutti build found", result.stderr)

    def test_non_utf8_config_is_read_with_a_warning(self):
        # Issue 11: this raised a UnicodeDecodeError traceback.
        with tempfile.TemporaryDirectory() as build_dir:
            with open(os.path.join(build_dir, "tutti_config.h"), "wb") as f:
                f.write(b"// \xff\xfe caf\xe9\n#define TUTTI_HAVE_CUDA 1\n"
                        b"#define TUTTI_HAVE_NCCL 0\n")
            result = run_launcher(["--check-build"], env=clean_environ(TUTTI_BUILD_DIR=build_dir))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("is not valid UTF-8", result.stderr)
        self.assertIn("    [ ] NCCL\n    [X] CUDA\n", result.stdout)

    def test_build_test_folder_is_found(self):
        # Issue 11: scripts/test builds in build-test/, which --check-build did not search.
        with tempfile.TemporaryDirectory() as repo:
            os.mkdir(os.path.join(repo, "build-test"))
            path = os.path.join(repo, "build-test", "tutti_config.h")
            with open(path, "w", encoding="utf-8") as f:
                f.write("#define TUTTI_HAVE_CUDA 0\n")
            self.assertEqual(tuttirun.find_build_config({}, repo_dir=repo), path)


    def test_demo_build_folder_is_found(self):
        # Issue 24: after scripts/demo, `tuttirun -np 2 --check-build` found no build: the demo
        # builds in build-demo/. The folder is read from the demo script itself.
        with open(os.path.join(os.path.dirname(TUTTIRUN), "demo"), encoding="utf-8") as f:
            folder = re.search(r"meson setup (\S+)", f.read()).group(1)
        with tempfile.TemporaryDirectory() as repo:
            os.mkdir(os.path.join(repo, folder))
            path = os.path.join(repo, folder, "tutti_config.h")
            with open(path, "w", encoding="utf-8") as f:
                f.write("#define TUTTI_HAVE_CUDA 0\n")
            self.assertEqual(tuttirun.find_build_config({}, repo_dir=repo), path)

    def test_horovod_build_dir_is_the_fallback_of_tutti_build_dir(self):
        # A tester's report: HOROVOD_BUILD_DIR was ignored, unlike every other knob's HOROVOD_
        # spelling (README, Configuration).
        with tempfile.TemporaryDirectory() as build_dir, \
                tempfile.TemporaryDirectory() as empty:
            path = os.path.join(build_dir, "tutti_config.h")
            with open(path, "w", encoding="utf-8") as f:
                f.write("#define TUTTI_HAVE_CUDA 1\n#define TUTTI_HAVE_NCCL 0\n")
            result = run_launcher(["--check-build"],
                                  env=clean_environ(HOROVOD_BUILD_DIR=build_dir))
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(f"(build configuration: {path})", result.stdout)
            self.assertIn("    [ ] NCCL\n    [X] CUDA\n", result.stdout)
            # TUTTI_BUILD_DIR wins, as the runtime reads TUTTI_ first; set but empty is unset.
            result = run_launcher(["--check-build"], env=clean_environ(
                TUTTI_BUILD_DIR=empty, HOROVOD_BUILD_DIR=build_dir))
            self.assertEqual(result.returncode, 1)
            self.assertIn(f"no tutti_config.h in {empty};", result.stderr)
            self.assertEqual(tuttirun.find_build_config(
                {"TUTTI_BUILD_DIR": "", "HOROVOD_BUILD_DIR": build_dir}, repo_dir=empty), path)

    def test_check_build_with_np(self):
        # As a new user types it after scripts/demo: -np is accepted and ignored.
        with tempfile.TemporaryDirectory() as build_dir:
            with open(os.path.join(build_dir, "tutti_config.h"), "w", encoding="utf-8") as f:
                f.write("#define TUTTI_HAVE_CUDA 0\n#define TUTTI_HAVE_NCCL 0\n")
            result = run_launcher(["-np", "2", "--check-build"],
                                  env=clean_environ(TUTTI_BUILD_DIR=build_dir))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("Available Tensor Operations:", result.stdout)


@unittest.skipUnless(shutil.which("mpirun"), "needs OpenMPI's mpirun")
class RealJobTest(unittest.TestCase):
    def test_exit_code_propagates(self):
        result = run_launcher(["-np", "1", "sh", "-c", "exit 3"])
        self.assertEqual(result.returncode, 3, result.stderr)

    def test_success_with_tagged_output_and_exported_settings(self):
        result = run_launcher(["-np", "2", "--cycle-time-ms", "7", "sh", "-c",
                               "echo cycle=$TUTTI_CYCLE_TIME"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("[1,0]<stdout>:cycle=7", result.stdout)
        self.assertIn("[1,1]<stdout>:cycle=7", result.stdout)

    def test_true_on_two_ranks_verbose(self):
        result = run_launcher(["--verbose", "-np", "2", "true"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("--tag-output -np 2 ", result.stdout)

    def test_more_ranks_than_cores(self):
        cores = tuttirun.local_core_count()
        if cores > 7:
            self.skipTest("too many cores to oversubscribe cheaply")
        result = run_launcher(["-np", str(cores + 1), "true"])
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_the_job_ends_when_stderrs_reader_has_gone(self):
        # An elastic job's stderr passes through tuttirun's relay (as a job on several hosts'
        # does). Its reader gone (`| head`), the relay stopped reading, mpirun blocked writing
        # to it once 64 KiB were waiting, and the job never ended.
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "discover")
            with open(script, "w", encoding="utf-8") as f:
                f.write("#!/bin/sh\necho localhost:2\n")
            os.chmod(script, 0o755)
            noisy = ("i=0; while [ $i -lt 3000 ]; do echo \"rank line $i padding padding "
                     "padding padding\" >&2; i=$((i+1)); done")
            child = subprocess.Popen([sys.executable, TUTTIRUN, "--host-discovery-script", script,
                                      "sh", "-c", noisy], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=clean_environ(TUTTI_ELASTIC_DIR=os.path.join(tmp, "c")))
            child.stderr.read(100)
            child.stderr.close()
            try:
                returncode = child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                self.fail("the job outlived its stderr's reader")
        self.assertEqual(returncode, 0)

    def test_sigterm_and_sigint_end_the_job(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=signum.name):
                child = subprocess.Popen([sys.executable, TUTTIRUN, "-np", "1", "sleep", "30"],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=clean_environ())
                time.sleep(1.0)
                start = time.monotonic()
                child.send_signal(signum)
                try:
                    returncode = child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    self.fail("the job outlived the signal")
                # As a shell reports a command the signal ended (mpirun itself exits 1).
                self.assertEqual(returncode, 128 + signum)
                self.assertLess(time.monotonic() - start, 20)

    def test_a_hostfile_naming_a_host_twice_runs(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hosts")
            with open(path, "w", encoding="utf-8") as f:
                f.write("localhost slots=2\nlocalhost slots=1\n")
            result = run_launcher(["-np", "3", "--hostfile", path, "sh", "-c", "echo ok"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("<stdout>:ok"), 3, result.stdout)

    def test_a_hostfile_naming_this_machine_twice_runs(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hosts")
            with open(path, "w", encoding="utf-8") as f:
                f.write(f"localhost slots=1\n{socket.gethostname()} slots=1\n")
            result = run_launcher(["-np", "2", "--hostfile", path, "sh", "-c", "echo ok"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("<stdout>:ok"), 2, result.stdout)

    def test_the_merged_hostfile_reaches_mpirun_and_is_removed(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hosts")
            with open(path, "w", encoding="utf-8") as f:
                f.write("localhost slots=1 max_slots=2\nlocalhost slots=1 max_slots=2\n")
            scratch = os.path.join(tmp, "scratch")
            os.mkdir(scratch)
            env = clean_environ(TMPDIR=scratch)
            # The rank prints the file mpirun was given.
            result = run_launcher(["-np", "1", "--hostfile", path, "sh", "-c",
                                   f"cat {scratch}/tuttirun-*.hostfile"], env=env)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("<stdout>:localhost slots=2 max_slots=4\n", result.stdout)
            self.assertEqual([n for n in os.listdir(scratch) if n.startswith("tuttirun-")], [])
            # Removed after SIGTERM too.
            child = subprocess.Popen([sys.executable, TUTTIRUN, "-np", "1", "--hostfile", path,
                                      "sleep", "30"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            deadline = time.monotonic() + 20
            while not any(n.startswith("tuttirun-") for n in os.listdir(scratch)):
                self.assertLess(time.monotonic(), deadline, "no merged hostfile appeared")
                time.sleep(0.1)
            time.sleep(1.0)  # Let mpirun start its rank.
            child.send_signal(signal.SIGTERM)
            self.assertEqual(child.wait(timeout=20), 128 + signal.SIGTERM)
            self.assertEqual([n for n in os.listdir(scratch) if n.startswith("tuttirun-")], [])

if __name__ == "__main__":
    unittest.main()
