# SPDX-License-Identifier: Apache-2.0
#
# The elastic driver of scripts/tuttirun (--host-discovery-script): runs the job on the hosts
# the discovery script lists, and relaunches it, restart-based as torchrun does (under Open MPI
# 4 a lost rank ends its mpirun job), when
#   - the job exits with status 75 (tutti::elastic::kRelaunchExitCode): it stopped at a commit
#     because tuttirun asked it to (below), or because Tutti's runtime stopped on an error;
#   - Open MPI reports a rank killed by a signal or a host lost: the host is excluded from
#     later launches until the discovery script drops it and lists it again (it was replaced),
#     unless it is the machine tuttirun runs on, which was not lost; a rank that aborted or
#     exited without finalizing is relaunched where it was.
# A rank that died of SIGABRT (an uncaught exception, a failed assert; Tutti's runtime stops
# with status 75 or MPI_Abort instead) or another non-zero status is the program's own error,
# which a relaunch would repeat: the job ends with it, as Horovod's elastic mode resets on
# HorovodInternalError and host failures and lets other exceptions end the job. While the job
# runs, the discovery script is polled (TUTTI_ELASTIC_DISCOVERY_INTERVAL seconds); when the
# launch it allows differs from the running one (a host added below --max-np, a host in use
# removed), tuttirun sends SIGUSR2 to mpirun, which forwards it to every rank, and the job
# stops at its next State::commit() (elastic::HostsUpdated) with status 75, or a rank with no
# handler yet dies of the signal: both relaunch without counting; any other status still ends
# the job as above. Each launch uses every usable slot up to --max-np (as horovodrun; -np is
# what the first launch waits for); below --min-np it waits up to --elastic-timeout seconds,
# then fails naming what is missing. --max-restarts bounds the relaunches after failures over
# the whole job; relaunches tuttirun asked for do not count. Every decision is one line on
# stderr starting "tuttirun: elastic: ".
#
# Python 3 standard library only; imported by scripts/tuttirun, which passes in what it owns
# (the mpirun command builder, Open MPI's failure scanner) so this module can be tested with
# a fake job.

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

RELAUNCH_EXIT_CODE = 75  # tutti::elastic::kRelaunchExitCode (include/tutti/elastic.h).
STOP_SIGNAL = signal.SIGUSR2  # Forwarded by mpirun to every rank; see src/elastic/stop_request.h.
# A discovery script that has not answered after this long is broken (Horovod would wait
# forever): its run counts as a failed discovery.
DISCOVERY_TIMEOUT_S = 30
# Open MPI failure kinds (tuttirun's HOST_FAILURES) after which the host is not used again:
# its daemon was lost, or a rank on it was killed by a signal.
EXCLUDING_KINDS = ("lost", "signal")
# The kind of a rank that aborted itself (SIGABRT): the program's error, not the host's.
PROGRAM_KIND = "program"
# Variables naming files or folders a launch writes: a relaunch gets its own, so that it keeps
# those of the launch before it. The runtime reads HOROVOD_<NAME> when TUTTI_<NAME> is unset,
# so both spellings are renamed. The flight recorder's dump folder is one: a launch that failed
# keeps the dumps that explain why (unset, every launch dumps to the one default folder).
PER_LAUNCH_PATHS = ("TUTTI_TIMELINE", "TUTTI_AUTOTUNE_LOG", "TUTTI_FLIGHT_RECORDER_DIR",
                    "HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_FLIGHT_RECORDER_DIR")


def this_machine_names():
    """The names this machine goes by: tuttirun runs here, so a rank killed here did not take
    the machine with it, whatever Open MPI or the discovery script calls it."""
    name = socket.gethostname()
    names = {name, name.split(".")[0], "localhost", "127.0.0.1", "::1"}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    return names


class ElasticError(Exception):
    """The elastic job cannot go on; the message says why."""


def log(message):
    """One decision's line on stderr; none once stderr's reader has gone (`| head`), so that
    the driver goes on with the job rather than stopping on the write."""
    try:
        print(f"tuttirun: elastic: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def hosts_text(host_slots):
    return ",".join(f"{host}:{slots}" for host, slots in host_slots) or "none"


def run_discovery(script, parse_hosts):
    """[(host, slots)] from the script's 'host[:slots]' lines ('#' comments and blank lines
    allowed; a bare host has 1 slot; a host named twice gets the sum). Raises ElasticError
    when the script fails, times out or prints a malformed line (named by its number)."""
    # A session of its own, so that a script past its time is ended with what it started (a
    # `sleep` it waits for would otherwise outlive it, one more at every poll).
    try:
        process = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, errors="replace", start_new_session=True)
    except OSError as e:
        raise ElasticError(f"cannot run the discovery script {script}: {e.strerror}") from None
    try:
        stdout, stderr = process.communicate(timeout=DISCOVERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # Unless one left the session.
            process.communicate(timeout=5)
        process.wait()
        raise ElasticError(f"the discovery script {script} did not finish within "
                           f"{DISCOVERY_TIMEOUT_S} s") from None
    result = subprocess.CompletedProcess([script], process.returncode, stdout, stderr)
    if result.returncode != 0:
        why = result.stderr.strip().splitlines()[-1:] or ["no message"]
        raise ElasticError(f"the discovery script {script} exited with status "
                           f"{result.returncode}: {why[0]}")
    entries = []
    for number, line in enumerate(result.stdout.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                entries += parse_hosts(line, what="host entry")
            except ValueError as e:
                raise ElasticError(f"the discovery script {script} printed a bad line "
                                   f"{number} ('{line}'): {e}") from None
    merged = {}
    for host, slots in entries:
        merged[host] = merged.get(host, 0) + slots
    return list(merged.items())


def plan_launch(discovered, excluded, current, min_np, max_np):
    """(host_slots, np) of the next launch: the hosts of `current` (the running launch's, kept
    first so that a change elsewhere leaves it alone) that are still listed, then the other
    listed hosts in the script's order, minus `excluded`, filled up to max_np slots (a host
    partly used lists only the slots used). None when fewer than min_np slots are usable."""
    usable = {host: slots for host, slots in discovered if host not in excluded}
    order = [host for host, _ in (current or []) if host in usable]
    order += [host for host, _ in discovered if host in usable and host not in order]
    plan, total = [], 0
    for host in order:
        if max_np is not None and total >= max_np:
            break
        used = usable[host] if max_np is None else min(usable[host], max_np - total)
        plan.append((host, used))
        total += used
    return (plan, total) if total >= min_np and total > 0 else None


def per_launch_path(path, launch, folder=False):
    """'t.json' -> 't.launch2.json' for launch 2; a folder (`folder`: 'dumps/' or 'd.x') ->
    'dumps.launch2', 'd.x.launch2', beside it, not inside it or within its name. The first
    launch keeps the name."""
    if launch == 1:
        return path
    if folder:
        return f"{path.rstrip('/') or '/'}.launch{launch}"
    root, extension = os.path.splitext(path)
    return f"{root}.launch{launch}{extension}"


def default_commit_dir(root="/tmp"):
    """A folder name unique to this tuttirun, valid on every host (`root`): the user, this host,
    the pid and the start time, and a number if this host has such a folder already. The pid
    alone was not unique: pids are reused and the folders are kept, so a new job once resumed
    from an old one's commits."""
    user = os.environ.get("USER") or str(os.geteuid())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(root, f"tutti-elastic-{user}-{socket.gethostname()}-{os.getpid()}-{stamp}")
    path, number = base, 1
    while os.path.exists(path):
        number += 1
        path = f"{base}-{number}"
    return path


class Launch:
    """One mpirun job: its stderr passes through Open MPI's failure scanner on its way to ours;
    SIGUSR2 asks it to stop at its next commit."""

    def __init__(self, command, env, scanner, relay):
        self.scanner = scanner
        self.asked_to_stop = False
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        self.relay = threading.Thread(target=relay, args=(self.process.stderr, sys.stderr.buffer,
                                                          scanner), daemon=True)
        self.relay.start()

    def wait(self, timeout):
        """The exit status (128+N for signal N), or None if still running after timeout s."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.relay.join(timeout=5)  # The pipe closes when mpirun and what it started are gone.
        if not self.relay.is_alive():
            self.process.stderr.close()
        return code if code >= 0 else 128 - code

    def ask_to_stop(self):
        self.asked_to_stop = True
        if self.process.poll() is None:
            self.process.send_signal(STOP_SIGNAL)

    def signal(self, signum):
        if self.process.poll() is None:
            self.process.send_signal(signum)


class ElasticDriver:
    """The relaunch loop. make_command(np, host_slots, launch, env) returns (argv, env) of one
    launch; make_scanner() a fresh Open MPI failure scanner (failures: host -> reason, kinds:
    host -> kind); relay(pipe, sink, scanner) copies stderr through it; parse_hosts(text, what)
    parses one line of 'host[:slots]' entries, calling an entry `what` in its errors."""

    def __init__(self, args, environ, make_command, make_scanner, relay, parse_hosts,
                 forward_sigint=True, here=None):
        self.script = args.host_discovery_script
        self.min_np = args.min_np
        self.max_np = args.max_np
        self.first_np = args.num_proc or args.min_np
        self.max_restarts = args.max_restarts
        self.timeout = args.elastic_timeout
        self.interval = args.discovery_interval
        self.environ = dict(environ)
        self.make_command = make_command
        self.make_scanner = make_scanner
        self.relay = relay
        self.parse_hosts = parse_hosts
        self.forward_sigint = forward_sigint
        self.excluded = {}  # host -> why
        # Never excluded (this_machine_names()): on one machine a killed rank excluded the only
        # host when the script named it as Open MPI does (`hostname`), and the job ended.
        self.here = this_machine_names() if here is None else set(here)
        self.interrupted = None  # The signal the user sent us, if any.
        self.launch = None
        self.discovered = None  # The script's last list.
        self.last_discovery_error = None

    # Discovery --------------------------------------------------------------------------------
    def discover(self):
        """The script's hosts; on a failure after a first success, the last list (logged)."""
        try:
            hosts = run_discovery(self.script, self.parse_hosts)
        except ElasticError as e:
            if self.discovered is None:
                raise
            if str(e) != self.last_discovery_error:
                log(f"{e}; keeping the last list ({hosts_text(self.discovered)})")
                self.last_discovery_error = str(e)
            return self.discovered
        self.last_discovery_error = None
        listed = {host for host, _ in hosts}
        for host in [h for h in self.excluded if h not in listed]:
            log(f"host {host} is no longer listed: its failure is forgotten (if it is listed "
                "again, it is used again)")
            del self.excluded[host]
        if hosts != self.discovered:
            log(f"discovered {hosts_text(hosts)}")
        self.discovered = hosts
        return hosts

    def wait_for_hosts(self, current, wanted):
        """The plan of the next launch, waiting up to --elastic-timeout for `wanted` slots
        (-np for the first launch, --min-np after); past the timeout, --min-np slots do.
        Raises ElasticError naming what is missing; None once tuttirun was interrupted."""
        deadline = time.monotonic() + self.timeout
        announced = False
        while not self.interrupted:
            plan = plan_launch(self.discover(), self.excluded, current, wanted, self.max_np)
            if plan is None and time.monotonic() >= deadline:
                plan = plan_launch(self.discovered, self.excluded, current, self.min_np,
                                   self.max_np)
                wanted = self.min_np
            if plan is not None:
                return plan
            usable = sum(slots for host, slots in self.discovered if host not in self.excluded)
            missing = (f"{usable} usable slot(s) ({hosts_text(self.discovered)} listed"
                       + (f"; excluded after failures: {', '.join(self.excluded)}"
                          if self.excluded else "") + f"), {wanted - usable} short of {wanted}")
            if time.monotonic() >= deadline:
                raise ElasticError(f"giving up: {missing} (--min-np {self.min_np}) for "
                                   f"{self.timeout:g} s (--elastic-timeout)")
            if not announced:
                log(f"waiting up to {self.timeout:g} s: {missing}")
                announced = True
            time.sleep(min(self.interval, max(0.0, deadline - time.monotonic())))
        return None

    # One launch -------------------------------------------------------------------------------
    def environment(self, number):
        env = dict(self.environ)
        for name in PER_LAUNCH_PATHS:
            if env.get(name):
                env[name] = per_launch_path(env[name], number, folder=name.endswith("_DIR"))
        return env

    def watch(self, plan):
        """Polls the discovery script while the launch runs; asks the job to stop once when
        the launch it would plan now differs from the running one. Returns the exit status."""
        while True:
            code = self.launch.wait(timeout=self.interval)
            if code is not None:
                return code
            if self.launch.asked_to_stop or self.interrupted:
                continue
            hosts = plan[0]
            now = plan_launch(self.discover(), self.excluded, hosts, self.min_np, self.max_np)
            if now != plan:
                change = "fewer than --min-np slots" if now is None else \
                    f"{hosts_text(hosts)} -> {hosts_text(now[0])}"
                log(f"the hosts changed ({change}): asking the job to stop at its next commit "
                    "(SIGUSR2)")
                self.launch.ask_to_stop()

    def outcome(self, number, code, scanner):
        """(relaunch?, counts as a restart?) for a launch that ended with `code`; logs why and
        excludes the hosts to blame."""
        asked = self.launch.asked_to_stop
        if code == 0:
            log(f"launch {number} finished: the job is done")
            return False, False
        if self.interrupted:
            log(f"launch {number} ended (status {code}) after tuttirun received signal "
                f"{self.interrupted}: not relaunching")
            return False, False
        # A rank that had no handler for the stop request yet (State not constructed) died of it
        # (Open MPI names the signal, and mpirun exits 128+12 as it does for a signal).
        died_of_stop = {host for host, why in scanner.failures.items()
                        if asked and f"signal {int(STOP_SIGNAL)}" in why}
        failed = {host: why for host, why in scanner.failures.items() if host not in died_of_stop}
        stop_killed = asked and (died_of_stop or code == 128 + int(STOP_SIGNAL))
        # After a stop request only status 75 or ranks dying of the request itself are the
        # stop: another status is the program's own error, which ends the job below even though
        # it came after the request (a relaunch would repeat it, uncounted, forever).
        if code == RELAUNCH_EXIT_CODE or (stop_killed and not failed):
            why = "as asked" if asked else "its runtime stopped on an error"
            log(f"launch {number} stopped at a commit to be relaunched ({why}, status {code})")
            return True, not asked
        detail = "; ".join(f"host {host}: {why}" for host, why in failed.items())
        # Only when every host's report is a rank aborting itself: a rank that aborted after
        # another host was lost is not the failure's cause.
        if failed and all(scanner.kinds.get(host) == PROGRAM_KIND for host in failed):
            log(f"launch {number} failed (status {code}): {detail}: the program's own error, "
                "which a relaunch would repeat: not relaunching")
            return False, False
        if failed:
            hit = [host for host in failed if scanner.kinds.get(host) in EXCLUDING_KINDS]
            blamed = [host for host in hit if host not in self.here]
            for host in blamed:
                self.excluded[host] = failed[host]
            excluded = f"; excluding {', '.join(blamed)}" if blamed else ""
            kept = [host for host in hit if host in self.here]
            if kept:
                excluded += (f"; not excluding {', '.join(kept)}: tuttirun runs there, so it "
                             "was not lost")
            log(f"launch {number} failed (status {code}): {detail}{excluded}")
            return True, True
        log(f"launch {number} failed with status {code}, the program's own error (no rank was "
            "lost): not relaunching")
        return False, False

    # The loop ---------------------------------------------------------------------------------
    def on_signal(self, signum, _frame):
        """SIGINT/SIGTERM: ends the job and the driver (no relaunch). A Ctrl-C at a terminal
        that we share with mpirun reached it already (forward_sigint False)."""
        self.interrupted = signum
        if self.launch is not None and (signum != signal.SIGINT or self.forward_sigint):
            self.launch.signal(signum)

    def exit_status(self, code):
        """tuttirun's status for a last launch that ended with code: 128+N after our signal N
        unless the job still succeeded, as for a plain job (mpirun exits 1 after SIGTERM)."""
        return 128 + self.interrupted if self.interrupted and code != 0 else code

    def run(self):
        """Runs the job to its end; returns tuttirun's exit status."""
        previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        except ElasticError as e:
            log(str(e))
            return 1
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def dry_run(self):
        """Prints the first launch's command (make_command does) without running anything. With
        fewer than -np slots listed now, says that a run would first wait for them."""
        try:
            discovered = self.discover()
        except ElasticError as e:
            log(str(e))
            return 1
        plan = plan_launch(discovered, {}, None, self.first_np, self.max_np)
        if plan is None:
            plan = plan_launch(discovered, {}, None, self.min_np, self.max_np)
            if plan is None:
                log(f"the discovery script lists fewer than --min-np {self.min_np} slots now")
                return 1
            log(f"the discovery script lists {plan[1]} slot(s) now, fewer than -np "
                f"{self.first_np}: a run would wait up to {self.timeout:g} s (--elastic-timeout) "
                "for more, then launch this")
        self.make_command(plan[1], plan[0], 1, self.environment(1))
        return 0

    def _run(self):
        restarts, number, current, code = 0, 0, None, 0
        while True:
            plan = self.wait_for_hosts(current, self.min_np if number else self.first_np)
            if plan is None:  # Interrupted.
                return 128 + self.interrupted
            number += 1
            current = plan[0]
            command, env = self.make_command(plan[1], plan[0], number, self.environment(number))
            log(f"launch {number}: {plan[1]} rank(s) on {hosts_text(plan[0])}")
            scanner = self.make_scanner()
            self.launch = Launch(command, env, scanner, self.relay)
            code = self.watch(plan)
            relaunch, counts = self.outcome(number, code, scanner)
            self.launch = None
            if not relaunch:
                return self.exit_status(code)
            if counts:
                restarts += 1
                if restarts > self.max_restarts:
                    log(f"giving up: {restarts - 1} relaunch(es) after failures already, "
                        f"--max-restarts {self.max_restarts}")
                    return code
                log(f"relaunching (restart {restarts} of at most {self.max_restarts})")
            else:
                log("relaunching on the hosts listed now (not counted in --max-restarts)")
