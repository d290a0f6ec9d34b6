# SPDX-License-Identifier: Apache-2.0
# Tests of tuttirun's elastic mode (scripts/elastic_driver.py and its flags in scripts/tuttirun)
# with a fake job in place of mpirun (fake_elastic_job.py): which launches happen on which
# hosts after a failure, a change of hosts, too few hosts; --max-restarts; the flags' checks;
# and tuttirun itself over a fake mpirun: each launch's file names, its exit status on a signal.
# Real elastic jobs run in the cluster suite (test/cluster/cluster_test.py, 'elastic').
#
# Usage: TUTTIRUN=scripts/tuttirun python3 test/launcher/elastic_driver_test.py [-v]

import argparse
import contextlib
import importlib.machinery
import importlib.util
import io
import os
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
TUTTIRUN = os.path.abspath(os.environ.get("TUTTIRUN") or
                           os.path.join(HERE, "..", "..", "scripts", "tuttirun"))
FAKE_JOB = os.path.join(HERE, "fake_elastic_job.py")


def load_launcher():
    loader = importlib.machinery.SourceFileLoader("tuttirun", TUTTIRUN)
    spec = importlib.util.spec_from_loader("tuttirun", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


tuttirun = load_launcher()
elastic_driver = tuttirun.elastic_driver


class Cluster:
    """A discovery script over a host list the test edits, and the driver's log lines."""

    def __init__(self, hosts):
        self.dir = tempfile.mkdtemp(prefix="tutti_elastic_driver_test.")
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.script = os.path.join(self.dir, "discover")
        with open(self.script, "w", encoding="utf-8") as f:
            f.write(f"#!/bin/sh\ncat {self.hosts_file}\n")
        os.chmod(self.script, 0o755)
        self.set_hosts(hosts)

    def set_hosts(self, text):
        with open(self.hosts_file + ".new", "w", encoding="utf-8") as f:
            f.write(text.replace(",", "\n") + "\n")
        os.replace(self.hosts_file + ".new", self.hosts_file)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def fake_mpirun_environ(cluster, body, **extra):
    """An environment for running tuttirun as a subprocess with, first on its PATH, an
    executable 'mpirun' (in cluster's folder) that runs the sh `body` in place of Open MPI's;
    no TUTTI_*/HOROVOD_* variables but extra, commits under the cluster's folder."""
    bin_dir = os.path.join(cluster.dir, "bin")
    os.mkdir(bin_dir)
    with open(os.path.join(bin_dir, "mpirun"), "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(os.path.join(bin_dir, "mpirun"), 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "HOROVOD_"))}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", TUTTI_ELASTIC_DISCOVERY_INTERVAL="0.1",
               TUTTI_ELASTIC_DIR=os.path.join(cluster.dir, "commits"))
    env.update(extra)
    return env


class DriverTest(unittest.TestCase):
    """Runs the driver in-process; each launch runs fake_elastic_job.py with the action the
    test gives for it, and is recorded as (np, 'host:slots,...')."""

    def setUp(self):
        self.log = []
        self.saved_log = elastic_driver.log
        elastic_driver.log = self.log.append
        self.launches = []

    def tearDown(self):
        elastic_driver.log = self.saved_log

    def drive(self, cluster, actions, min_np=1, max_np=None, max_restarts=3, timeout=5.0,
              num_proc=None, here=("tuttirun-host",)):
        args = argparse.Namespace(host_discovery_script=cluster.script, min_np=min_np,
                                  max_np=max_np, num_proc=num_proc, max_restarts=max_restarts,
                                  elastic_timeout=timeout, discovery_interval=0.1)

        def make_command(np, host_slots, number, env):
            self.launches.append((np, elastic_driver.hosts_text(host_slots)))
            return [sys.executable, FAKE_JOB] + actions[number - 1], env

        driver = elastic_driver.ElasticDriver(args, {"PATH": os.environ["PATH"]}, make_command,
                                              tuttirun.HostFailureScanner, tuttirun._relay,
                                              tuttirun.parse_hosts, here=here)
        return driver.run()

    def logged(self, text):
        return any(text in line for line in self.log)

    def test_a_job_that_finishes_runs_once(self):
        cluster = Cluster("a:2,b:2")
        self.addCleanup(cluster.remove)
        self.assertEqual(self.drive(cluster, [["exit", "0"]]), 0)
        self.assertEqual(self.launches, [(4, "a:2,b:2")])

    def test_a_lost_rank_excludes_its_host(self):
        cluster = Cluster("a:2,b:2")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["killed", "b", "9", "137"], ["exit", "0"]], min_np=2)
        self.assertEqual(code, 0)
        self.assertEqual(self.launches, [(4, "a:2,b:2"), (2, "a:2")])
        self.assertTrue(self.logged("launch 1 failed (status 137): host b: rank 1 was killed by "
                                    "signal 9 (Killed); excluding b"), self.log)
        self.assertTrue(self.logged("relaunching (restart 1 of at most 3)"), self.log)

    def test_a_rank_killed_on_tuttiruns_own_machine_does_not_exclude_it(self):
        # One machine, its script printing the name Open MPI reports (`hostname`): excluding it
        # left no host, and the job ended instead of relaunching.
        cluster = Cluster("a:2")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["killed", "a", "9", "137"], ["exit", "0"]], min_np=2,
                          here=("a",))
        self.assertEqual(code, 0)
        self.assertEqual(self.launches, [(2, "a:2"), (2, "a:2")])
        self.assertTrue(self.logged("launch 1 failed (status 137): host a: rank 1 was killed by "
                                    "signal 9 (Killed); not excluding a: tuttirun runs there, so "
                                    "it was not lost"), self.log)
        self.assertFalse(self.logged("excluding a;"), self.log)

    def test_this_machine_goes_by_its_host_name_and_localhost(self):
        names = elastic_driver.this_machine_names()
        self.assertIn(socket.gethostname(), names)
        self.assertIn("localhost", names)

    def test_max_restarts_0_means_none(self):
        cluster = Cluster("a:2,b:2")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["killed", "b", "9", "137"], ["exit", "0"]], max_restarts=0)
        self.assertEqual(code, 137)
        self.assertEqual(len(self.launches), 1)
        self.assertTrue(self.logged("giving up: 0 relaunch(es) after failures already, "
                                    "--max-restarts 0"), self.log)

    def test_max_restarts_bounds_the_whole_job(self):
        cluster = Cluster("a:1,b:1,c:1")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["exit", "75"], ["aborted", "b", "1"], ["exit", "75"],
                                    ["exit", "0"]], max_restarts=2)
        self.assertEqual(code, 75)
        self.assertEqual(len(self.launches), 3)

    def test_an_abort_is_relaunched_where_it_was(self):
        cluster = Cluster("a:1,b:1")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["aborted", "b", "1"], ["exit", "0"]])
        self.assertEqual(code, 0)
        self.assertEqual(self.launches, [(2, "a:1,b:1"), (2, "a:1,b:1")])

    def test_the_programs_own_error_is_not_relaunched(self):
        cluster = Cluster("a:1")
        self.addCleanup(cluster.remove)
        self.assertEqual(self.drive(cluster, [["exit", "3"], ["exit", "0"]]), 3)
        self.assertEqual(len(self.launches), 1)
        self.assertTrue(self.logged("the program's own error"), self.log)

    def test_a_rank_aborting_itself_is_the_programs_error(self):
        # SIGABRT: an uncaught exception or a failed assert, which would recur on any host.
        cluster = Cluster("a:1,b:1")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["killed", "b", "6", "134"], ["exit", "0"]])
        self.assertEqual(code, 134)
        self.assertEqual(self.launches, [(2, "a:1,b:1")])
        self.assertTrue(self.logged("launch 1 failed (status 134): host b: rank 1 aborted "
                                    "(SIGABRT: an uncaught exception or a failed assertion): "
                                    "the program's own error"), self.log)
        self.assertFalse(self.logged("excluding"), self.log)

    def test_np_is_what_the_first_launch_waits_for_and_max_np_caps_it(self):
        # As horovodrun: every listed slot up to --max-np is used, whatever -np.
        cluster = Cluster("a:4")
        self.addCleanup(cluster.remove)
        self.assertEqual(self.drive(cluster, [["exit", "0"]], num_proc=2), 0)
        self.assertEqual(self.drive(cluster, [["exit", "0"]], num_proc=2, max_np=2), 0)
        self.assertEqual(self.launches, [(4, "a:4"), (2, "a:2")])

    def test_a_change_of_hosts_stops_the_job_and_is_not_a_restart(self):
        cluster = Cluster("a:1")
        self.addCleanup(cluster.remove)
        threading.Timer(0.5, cluster.set_hosts, args=("a:1,b:1",)).start()
        code = self.drive(cluster, [["wait-stop"], ["exit", "0"]], max_np=2, max_restarts=0)
        self.assertEqual(code, 0)
        self.assertEqual(self.launches, [(1, "a:1"), (2, "a:1,b:1")])
        self.assertTrue(self.logged("the hosts changed (a:1 -> a:1,b:1): asking the job to stop"),
                        self.log)
        self.assertTrue(self.logged("not counted in --max-restarts"), self.log)

    def test_a_host_beyond_max_np_changes_nothing(self):
        cluster = Cluster("a:2")
        self.addCleanup(cluster.remove)
        threading.Timer(0.3, cluster.set_hosts, args=("a:2,b:2",)).start()
        # The job runs past the change (which the driver polls every 0.1 s).
        code = self.drive(cluster, [["sleep", "1.5"]], max_np=2)
        self.assertEqual(code, 0)
        self.assertFalse(self.logged("asking the job to stop"), self.log)

    def test_a_rank_without_a_handler_dying_of_the_stop_request_is_relaunched(self):
        cluster = Cluster("a:1,b:1")
        self.addCleanup(cluster.remove)
        threading.Timer(0.5, cluster.set_hosts, args=("a:1",)).start()
        code = self.drive(cluster, [["die-on-stop", "b"], ["exit", "0"]], max_restarts=0)
        self.assertEqual(code, 0)
        self.assertEqual(self.launches, [(2, "a:1,b:1"), (1, "a:1")])
        self.assertFalse(self.logged("excluding"), self.log)

    def test_the_programs_own_error_after_a_stop_request_ends_the_job(self):
        # Asked to stop, the program fails with a status of its own (not 75, no rank killed by
        # SIGUSR2): that error would recur, so the job ends with it instead of relaunching.
        cluster = Cluster("a:1")
        self.addCleanup(cluster.remove)
        ready = os.path.join(cluster.dir, "ready")

        def add_a_host_once_ready():  # Not before the job handles SIGUSR2, however slow.
            deadline = time.monotonic() + 20
            while not os.path.exists(ready) and time.monotonic() < deadline:
                time.sleep(0.05)
            cluster.set_hosts("a:1,b:1")

        threading.Thread(target=add_a_host_once_ready, daemon=True).start()
        code = self.drive(cluster, [["fail-on-stop", "3", ready], ["exit", "0"]], max_np=2)
        self.assertEqual(code, 3)
        self.assertEqual(self.launches, [(1, "a:1")])
        self.assertTrue(self.logged("asking the job to stop"), self.log)
        self.assertTrue(self.logged("launch 1 failed with status 3, the program's own error"),
                        self.log)
        self.assertFalse(self.logged("stopped at a commit"), self.log)

    def test_below_min_np_it_waits_then_fails_naming_what_is_missing(self):
        cluster = Cluster("a:1")
        self.addCleanup(cluster.remove)
        start = time.monotonic()
        code = self.drive(cluster, [["exit", "0"]], min_np=2, timeout=1)
        self.assertEqual(code, 1)
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(self.launches, [])
        self.assertTrue(self.logged("giving up: 1 usable slot(s) (a:1 listed), 1 short of 2 "
                                    "(--min-np 2) for 1 s (--elastic-timeout)"), self.log)

    def test_below_min_np_after_a_failure_names_the_excluded_host(self):
        cluster = Cluster("a:1,b:1")
        self.addCleanup(cluster.remove)
        code = self.drive(cluster, [["killed", "b", "9", "137"]], min_np=2, timeout=0.5)
        self.assertEqual(code, 1)
        # The excluded host is among those listed: one no longer listed is forgotten
        # (discover()). The README quotes this line.
        self.assertEqual(self.log[-1], "giving up: 1 usable slot(s) (a:1,b:1 listed; excluded "
                         "after failures: b), 1 short of 2 (--min-np 2) for 0.5 s "
                         "(--elastic-timeout)")

    def test_it_waits_for_a_host_to_come(self):
        cluster = Cluster("a:1")
        self.addCleanup(cluster.remove)
        threading.Timer(0.5, cluster.set_hosts, args=("a:1,b:1",)).start()
        self.assertEqual(self.drive(cluster, [["exit", "0"]], min_np=2, timeout=20), 0)
        self.assertEqual(self.launches, [(2, "a:1,b:1")])
        self.assertTrue(self.logged("waiting up to 20 s: 1 usable slot(s)"), self.log)

    def test_np_is_waited_for_at_first_then_min_np_will_do(self):
        cluster = Cluster("a:1")
        self.addCleanup(cluster.remove)
        self.assertEqual(self.drive(cluster, [["exit", "0"]], num_proc=2, timeout=0.5), 0)
        self.assertEqual(self.launches, [(1, "a:1")])

    def test_an_excluded_host_is_used_again_once_the_script_relists_it(self):
        cluster = Cluster("a:1,b:1")
        self.addCleanup(cluster.remove)
        args = argparse.Namespace(host_discovery_script=cluster.script, min_np=1, max_np=None,
                                  num_proc=None, max_restarts=3, elastic_timeout=1,
                                  discovery_interval=0.1)
        driver = elastic_driver.ElasticDriver(args, {}, None, None, None, tuttirun.parse_hosts)
        driver.excluded["b"] = "rank 1 was killed by signal 9"
        driver.discover()
        self.assertIn("b", driver.excluded)
        cluster.set_hosts("a:1")
        driver.discover()
        self.assertNotIn("b", driver.excluded)
        cluster.set_hosts("a:1,b:1")
        self.assertEqual(elastic_driver.plan_launch(driver.discover(), driver.excluded, None, 1,
                                                    None), ([("a", 1), ("b", 1)], 2))


class PlanTest(unittest.TestCase):
    def test_fills_up_to_max_np_keeping_the_running_hosts_first(self):
        plan = elastic_driver.plan_launch
        self.assertEqual(plan([("a", 2), ("b", 2)], {}, None, 1, None),
                         ([("a", 2), ("b", 2)], 4))
        self.assertEqual(plan([("a", 2), ("b", 2)], {}, None, 1, 3), ([("a", 2), ("b", 1)], 3))
        self.assertEqual(plan([("a", 2), ("b", 2)], {}, [("b", 2)], 1, 3),
                         ([("b", 2), ("a", 1)], 3))
        self.assertEqual(plan([("a", 2), ("b", 2)], {"a": "lost"}, None, 1, None),
                         ([("b", 2)], 2))
        self.assertIsNone(plan([("a", 2), ("b", 2)], {"a": "lost"}, None, 3, None))
        self.assertIsNone(plan([], {}, None, 1, None))

    def test_the_default_commit_dir_is_not_an_earlier_jobs(self):
        # Pids are reused and commit folders are kept: a folder named by the pid alone was once
        # an earlier job's, and the new job resumed from its commits.
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        first = elastic_driver.default_commit_dir(root)
        self.assertTrue(first.startswith(os.path.join(root, "tutti-elastic-")), first)
        self.assertIn(f"-{os.getpid()}-", first)
        os.mkdir(first)  # What the first job leaves behind.
        second = elastic_driver.default_commit_dir(root)
        self.assertNotEqual(second, first)
        self.assertFalse(os.path.exists(second))

    def test_per_launch_paths(self):
        self.assertEqual(elastic_driver.per_launch_path("/t/x.json", 1), "/t/x.json")
        self.assertEqual(elastic_driver.per_launch_path("/t/x.json", 3), "/t/x.launch3.json")
        self.assertEqual(elastic_driver.per_launch_path("/t/log", 2), "/t/log.launch2")
        # A folder is renamed beside itself, not inside it or before a dot in its name.
        self.assertEqual(elastic_driver.per_launch_path("/t/dumps/", 2, folder=True),
                         "/t/dumps.launch2")
        self.assertEqual(elastic_driver.per_launch_path("/t/fr.d", 3, folder=True),
                         "/t/fr.d.launch3")
        self.assertEqual(elastic_driver.per_launch_path("/t/fr.d", 1, folder=True), "/t/fr.d")


class DiscoveryTest(unittest.TestCase):
    def script(self, body):
        directory = tempfile.mkdtemp(prefix="tutti_discovery_test.")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "discover")
        with open(path, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)
        return path

    def discover(self, body):
        return elastic_driver.run_discovery(self.script(body), tuttirun.parse_hosts)

    def test_lines_comments_bare_hosts_and_repeats(self):
        self.assertEqual(self.discover("echo 'a:2'; echo; echo '# spare'; echo 'b'; echo 'a:1'\n"),
                         [("a", 3), ("b", 1)])

    def test_failures_are_named(self):
        for body, text in (("echo 'a:x'\n", "printed a bad line 1 ('a:x'): malformed host entry "
                                           "'a:x': slots must be a positive integer"),
                           ("echo a; echo 'b c'\n", "printed a bad line 2 ('b c'): malformed "
                                                    "host entry 'b c': expected host[:slots]"),
                           ("echo oops >&2; exit 4\n", "exited with status 4: oops")):
            with self.subTest(body=body):
                with self.assertRaises(elastic_driver.ElasticError) as caught:
                    self.discover(body)
                self.assertIn(text, str(caught.exception))

    def test_a_script_that_hangs_is_cut_off(self):
        saved = elastic_driver.DISCOVERY_TIMEOUT_S
        elastic_driver.DISCOVERY_TIMEOUT_S = 0.5
        self.addCleanup(setattr, elastic_driver, "DISCOVERY_TIMEOUT_S", saved)
        with self.assertRaises(elastic_driver.ElasticError) as caught:
            self.discover("exec sleep 30\n")
        self.assertIn("did not finish within 0.5 s", str(caught.exception))

    def test_a_script_cut_off_takes_what_it_started_with_it(self):
        # Before, only the script was killed: the sleep it waited for outlived it, one more at
        # every poll of a slow discovery command.
        saved = elastic_driver.DISCOVERY_TIMEOUT_S
        elastic_driver.DISCOVERY_TIMEOUT_S = 0.5
        self.addCleanup(setattr, elastic_driver, "DISCOVERY_TIMEOUT_S", saved)
        marker = tempfile.mkdtemp(prefix="tutti_discovery_test.")
        self.addCleanup(shutil.rmtree, marker, True)
        pid_file = os.path.join(marker, "pid")
        with self.assertRaises(elastic_driver.ElasticError):
            self.discover(f"sleep 30 &\necho $! > {pid_file}\nwait\n")
        with open(pid_file, encoding="utf-8") as f:
            pid = int(f.read())
        def running():  # A zombie waiting for init to reap it has ended.
            try:
                with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and running():
            time.sleep(0.05)
        self.assertFalse(running(), "the script's sleep outlived it")


class FlagTest(unittest.TestCase):
    def parse_error(self, argv):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as caught:
            tuttirun.parse_args(argv)
        self.assertEqual(caught.exception.code, 2)
        return stderr.getvalue()

    def test_elastic_flags_need_the_discovery_script(self):
        for flags in (["--min-np", "2"], ["--max-np", "4"], ["--max-restarts", "1"],
                      ["--elastic-timeout", "5"]):
            with self.subTest(flags=flags):
                self.assertIn(f"{flags[0]} needs --host-discovery-script",
                              self.parse_error(["-np", "2"] + flags + ["prog"]))

    def test_bad_combinations(self):
        self.assertIn("drop -H/--hostfile", self.parse_error(
            ["--host-discovery-script", "d", "-H", "a:2", "prog"]))
        self.assertIn("--max-np 1 is below --min-np 2", self.parse_error(
            ["--host-discovery-script", "d", "--min-np", "2", "--max-np", "1", "prog"]))
        self.assertIn("-np 5 is outside --min-np 1 .. --max-np 4", self.parse_error(
            ["--host-discovery-script", "d", "-np", "5", "--min-np", "1", "--max-np", "4",
             "prog"]))
        self.assertIn("'-1' must be between 0", self.parse_error(
            ["--host-discovery-script", "d", "--max-restarts", "-1", "prog"]))

    def test_defaults(self):
        args = tuttirun.parse_args(["--host-discovery-script", "d", "prog"])
        self.assertEqual((args.num_proc, args.min_np, args.max_np, args.max_restarts),
                         (None, 1, None, tuttirun.DEFAULT_MAX_RESTARTS))
        args = tuttirun.parse_args(["--host-discovery-script", "d", "-np", "3", "prog"])
        self.assertEqual(args.min_np, 3)

    def test_dry_run_prints_the_first_launch(self):
        cluster = Cluster("localhost:2")
        self.addCleanup(cluster.remove)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "HOROVOD_"))}
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "--dry-run", "--output-filename", "/tmp/o",
                                 "true", "x"], capture_output=True, text=True, env=env,
                                timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("-np 2 -H localhost:2", result.stdout)
        self.assertIn("--output-filename /tmp/o/launch1", result.stdout)
        self.assertIn("TUTTI_ELASTIC_DIR=/tmp/tutti-elastic-", result.stdout)
        self.assertIn("-x TUTTI_ELASTIC_DIR", result.stdout)

    def test_dry_run_says_a_run_would_wait_for_np(self):
        # Before, -np was not looked at: the launch on --min-np's slots was printed as if a run
        # would start it at once.
        cluster = Cluster("localhost:2")
        self.addCleanup(cluster.remove)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "HOROVOD_"))}
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "-np", "4", "--min-np", "2",
                                 "--elastic-timeout", "7", "--dry-run", "true"],
                                capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("-np 2 -H localhost:2", result.stdout)
        self.assertIn("lists 2 slot(s) now, fewer than -np 4: a run would wait up to 7 s "
                      "(--elastic-timeout) for more, then launch this", result.stderr)
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "-np", "2", "--dry-run", "true"],
                                capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("would wait", result.stderr)
        # Below --min-np (here -np, its default) no command is shown, and the dry run fails.
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "-np", "4", "--dry-run", "true"],
                                capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertIn("tuttirun: elastic: the discovery script lists fewer than --min-np 4 slots "
                      "now\n", result.stderr)

    def test_a_script_named_without_a_slash_is_the_file_checked(self):
        # Before, the check found ./discover but the run looked for 'discover' on PATH.
        cluster = Cluster("localhost:2")
        self.addCleanup(cluster.remove)
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script", "discover",
                                 "--dry-run", "true"], capture_output=True, text=True,
                                timeout=60, cwd=cluster.dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("-np 2 -H localhost:2", result.stdout)

    def test_a_bad_line_names_the_script_by_its_absolute_path(self):
        # The README's example once named it as typed ('./hosts.sh').
        cluster = Cluster("localhost:1,b:x")
        self.addCleanup(cluster.remove)
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 "./discover", "--dry-run", "true"], capture_output=True,
                                text=True, timeout=60, cwd=cluster.dir)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"tuttirun: elastic: the discovery script "
                      f"{os.path.realpath(cluster.script)} printed a bad line 2 ('b:x'): "
                      "malformed host entry 'b:x': slots must be a positive integer\n",
                      result.stderr)

    def test_horovodrun_spellings_of_the_elastic_bounds(self):
        args = tuttirun.parse_args(["--host-discovery-script", "d", "--min-num-proc", "2",
                                    "--max-num-proc", "3", "prog"])
        self.assertEqual((args.min_np, args.max_np), (2, 3))

    def test_the_commit_folder_variable(self):
        # A tester's report: HOROVOD_ELASTIC_DIR was overridden by a new TUTTI_ELASTIC_DIR,
        # which the runtime reads first, so the job wrote its commits elsewhere.
        for env, variable, value in (
                ({"TUTTI_ELASTIC_DIR": "/t", "HOROVOD_ELASTIC_DIR": "/h"}, "TUTTI_ELASTIC_DIR",
                 "/t"),
                ({"HOROVOD_ELASTIC_DIR": "/h"}, "HOROVOD_ELASTIC_DIR", "/h"),
                ({"TUTTI_ELASTIC_DIR": "", "HOROVOD_ELASTIC_DIR": "/h"}, "TUTTI_ELASTIC_DIR",
                 "/h"),
                ({"HOROVOD_ELASTIC_DIR": ""}, "TUTTI_ELASTIC_DIR", None)):
            with self.subTest(env=env):
                env = dict(env)
                before = dict(env)
                self.assertEqual(tuttirun.elastic_dir(env), variable)
                if value is None:  # A new folder.
                    self.assertTrue(env[variable].startswith("/tmp/tutti-elastic-"), env)
                else:
                    self.assertEqual(env[variable], value)
                self.assertEqual({k: v for k, v in env.items() if k != variable},
                                 {k: v for k, v in before.items() if k != variable})

    def test_dry_run_keeps_horovod_elastic_dir(self):
        cluster = Cluster("localhost:2")
        self.addCleanup(cluster.remove)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "HOROVOD_"))}
        env["HOROVOD_ELASTIC_DIR"] = "/tmp/h-commits"
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "--dry-run", "true"], capture_output=True,
                                text=True, env=env, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("TUTTI_ELASTIC_DIR", result.stdout)
        self.assertIn(" -x HOROVOD_ELASTIC_DIR ", result.stdout)

    def test_a_missing_program_on_this_machine_is_a_usage_error(self):
        # As for a plain job; before, mpirun's launch failed (status 132) and was not relaunched.
        cluster = Cluster("localhost:2")
        self.addCleanup(cluster.remove)
        for extra in ([], ["--dry-run"]):
            with self.subTest(extra=extra):
                result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                         cluster.script] + extra + ["/nonexistent/prog"],
                                        capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("tuttirun: error: program '/nonexistent/prog' not found",
                              result.stderr)

    def test_a_missing_script_and_bad_knobs_are_usage_errors(self):
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 "/nonexistent/discover", "true"], capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("is not an executable file", result.stderr)
        cluster = Cluster("localhost:1")
        self.addCleanup(cluster.remove)
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "true"], capture_output=True, text=True,
                                timeout=60,
                                env=dict(os.environ, TUTTI_ELASTIC_DISCOVERY_INTERVAL="0"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("TUTTI_ELASTIC_DISCOVERY_INTERVAL: '0' must be between 0.05", result.stderr)
        # Launcher knobs, which init() never reads: tuttirun checks them, HOROVOD_ too.
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("TUTTI_", "HOROVOD_"))}
        for variable, value, message in (
                ("TUTTI_ELASTIC_TIMEOUT", "soon", "'soon' is not a number"),
                ("HOROVOD_ELASTIC_TIMEOUT", "-1", "'-1' must be between 0 and 1000000"),
                ("HOROVOD_ELASTIC_DISCOVERY_INTERVAL", "", "'' is not a number"),
                ("HOROVOD_ELASTIC_DISCOVERY_INTERVAL", "nan", "'nan' is not a number")):
            with self.subTest(variable=variable, value=value):
                result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                         cluster.script, "--dry-run", "true"],
                                        capture_output=True, text=True, timeout=60,
                                        env=dict(clean, **{variable: value}))
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stdout, "")
                self.assertIn(f"tuttirun: error: {variable}: {message}\n", result.stderr)


class FakeMpirunTest(unittest.TestCase):
    """tuttirun in elastic mode as a subprocess, with a fake mpirun (fake_mpirun_environ)."""

    def test_each_launch_after_the_first_writes_its_own_files(self):
        cluster = Cluster("localhost:1")
        self.addCleanup(cluster.remove)
        record = os.path.join(cluster.dir, "record")
        # Launch 1 stops to be relaunched (status 75), launch 2 finishes.
        env = fake_mpirun_environ(
            cluster, f'echo "$TUTTI_TIMELINE $TUTTI_AUTOTUNE_LOG $HOROVOD_TIMELINE '
                     f'$HOROVOD_AUTOTUNE_LOG $TUTTI_FLIGHT_RECORDER_DIR" >> {record}\n'
                     f'[ "$(wc -l < {record})" -ge 2 ] && exit 0\nexit 75\n',
            HOROVOD_TIMELINE="/d/h.json", HOROVOD_AUTOTUNE_LOG="/d/ha.csv",
            TUTTI_FLIGHT_RECORDER_DIR="/d/dumps")
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "--timeline-filename", "/d/t.json",
                                 "--autotune", "--autotune-log-file", "/d/a.csv", "true"],
                                capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(record, encoding="utf-8") as f:
            self.assertEqual(f.read().splitlines(), [
                "/d/t.json /d/a.csv /d/h.json /d/ha.csv /d/dumps",
                "/d/t.launch2.json /d/a.launch2.csv /d/h.launch2.json /d/ha.launch2.csv "
                "/d/dumps.launch2"])

    def test_horovod_elastic_dir_is_where_the_commits_go(self):
        cluster = Cluster("localhost:1")
        self.addCleanup(cluster.remove)
        record = os.path.join(cluster.dir, "record")
        commits = os.path.join(cluster.dir, "h-commits")
        env = fake_mpirun_environ(
            cluster, f'echo "[$TUTTI_ELASTIC_DIR] [$HOROVOD_ELASTIC_DIR]" > {record}\n',
            HOROVOD_ELASTIC_DIR=commits)
        del env["TUTTI_ELASTIC_DIR"]
        result = subprocess.run([sys.executable, TUTTIRUN, "--host-discovery-script",
                                 cluster.script, "true"], capture_output=True, text=True,
                                env=env, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"tuttirun: elastic: commits under HOROVOD_ELASTIC_DIR={commits} on every "
                      "host\n", result.stderr)
        with open(record, encoding="utf-8") as f:
            self.assertEqual(f.read(), f"[] [{commits}]\n")

    def test_a_signal_ends_the_job_with_128_plus_its_number(self):
        # As a plain job (tuttirun_test.py); mpirun itself exits 1 after forwarding SIGTERM.
        for signum in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=signum.name):
                cluster = Cluster("localhost:1")
                self.addCleanup(cluster.remove)
                started = os.path.join(cluster.dir, "started")
                env = fake_mpirun_environ(cluster, "trap 'kill $child; exit 1' TERM INT\n"
                                          f"sleep 30 & child=$!\ntouch {started}\nwait $child\n")
                child = subprocess.Popen([sys.executable, TUTTIRUN, "--host-discovery-script",
                                          cluster.script, "true"], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         env=env)
                deadline = time.monotonic() + 20
                while not os.path.exists(started) and time.monotonic() < deadline:
                    time.sleep(0.05)
                child.send_signal(signum)
                try:
                    returncode = child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    self.fail("the job outlived the signal")
                self.assertEqual(returncode, 128 + signum)


if __name__ == "__main__":
    unittest.main()
