# SPDX-License-Identifier: Apache-2.0
# Tests of scripts/tutti-trace, the reader of the flight recorder's dumps.
#
# Usage: TRACE_SCRIPT=scripts/tutti-trace python3 test/debug/tutti_trace_test.py [-v]
# (without TRACE_SCRIPT the script is found relative to this file). Each test writes the dumps
# the C++ runtime would write (rank<R>.json) into a temporary folder and checks what the script
# says about them; the analysis runs in-process, and once as a subprocess.

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.environ.get("TRACE_SCRIPT") or os.path.join(HERE, "..", "..", "scripts", "tutti-trace")
TRACE = os.path.abspath(TRACE)


def load_script():
    loader = importlib.machinery.SourceFileLoader("tutti_trace", TRACE)
    spec = importlib.util.spec_from_loader("tutti_trace", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


trace = load_script()


def op(seq, name, state="done", set_id=0, kind="ALLREDUCE", dtype="float32", shape=(10, 20),
       at=None, error=""):
    """One op record as the runtime writes it; timestamps not reached are -1."""
    at = float(seq) if at is None else at
    reached = ["submitted", "negotiated", "executing", "done"].index(
        "done" if state == "failed" else state)
    stamps = [at + 0.001 * i if i <= reached else -1 for i in range(4)]
    return {"sequence": seq, "set": set_id, "name": name, "op": kind, "dtype": dtype,
            "shape": list(shape), "tensors": 1, "state": state,
            "backend": "shm" if reached >= 2 else "", "submitted_s": stamps[0],
            "negotiated_s": stamps[1], "executing_s": stamps[2],
            "finished_s": stamps[3] if state in ("done", "failed") else -1, "error": error}


def make_dump(rank, size, ops, job="job-a", sets=None, capacity=2000, recorded=None,
              reason="stall: collectives waiting", dumped_s=100.0):
    """One rank's dump; sets defaults to set 0 holding every rank."""
    return {"format": "tutti-flight-recorder", "version": 1, "job": job, "rank": rank,
            "size": size, "host": f"node{rank}", "pid": 1000 + rank, "reason": reason,
            "dumped_s": dumped_s, "capacity": capacity,
            "recorded": len(ops) if recorded is None else recorded,
            "sets": sets if sets is not None else {"0": list(range(size))}, "ops": ops}


def write(directory, dump, mtime=None, name=None):
    """Writes dump as rank<R>.json (or name), with the file's mtime set when given."""
    path = os.path.join(directory, name or f"rank{dump['rank']}.json")
    with open(path, "w") as f:
        json.dump(dump, f)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def grads(n, state="done", start=0, **kw):
    """Ops start..n-1 named grad.<seq>."""
    return [op(s, f"grad.{s}", state, **kw) for s in range(start, n)]


def run(directory, *flags):
    """(exit status, stdout, stderr) of the script's main, in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = trace.main([directory, *flags])
        except SystemExit as e:  # argparse's usage errors
            status = e.code
    return status, out.getvalue(), err.getvalue()


class TraceTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        self.addCleanup(self._tmp.cleanup)

    def analyse(self, *flags):
        status, out, err = run(self.dir, *flags)
        self.assertEqual(status, 0, err)
        return out

    def test_all_agree(self):
        for r in range(4):
            write(self.dir, make_dump(r, 4, grads(5), reason="SIGUSR1"))
        out = self.analyse()
        self.assertIn("job job-a: 4 of 4 ranks dumped", out)
        self.assertIn("rank 2 on node2 pid 1002 at 100.0 s: SIGUSR1", out)
        self.assertIn("set 0: all 4 members agree on seqs 0..4", out)
        self.assertIn("rank 3: idle, last op seq 4 ALLREDUCE 'grad.4' of set 0 done", out)
        self.assertNotIn("never submitted", out)
        self.assertNotIn("no dump from", out)

    def test_rank_skipped_an_allreduce(self):
        # Ranks 0, 2, 3 wait in grad.fc1 (seq 42); rank 1 skipped it: its seq 42 is grad.fc2.
        head = grads(42)
        for r in (0, 2, 3):
            write(self.dir, make_dump(r, 4, head + [op(42, "grad.fc1", "submitted", at=80.0),
                                                    op(43, "grad.fc2", "submitted", at=80.5)]))
        write(self.dir, make_dump(1, 4, head + [op(42, "grad.fc2", "submitted", at=80.0)]))
        out = self.analyse()
        self.assertIn("rank 1 never submitted seq 42 ALLREDUCE 'grad.fc1' of set 0; "
                      "ranks 0,2,3 are waiting in it", out)
        self.assertIn("rank 1 submitted 'grad.fc2' as seq 42 instead", out)
        self.assertIn("rank 0: in seq 42 ALLREDUCE 'grad.fc1' of set 0 "
                      "(submitted, 20.0 s before its dump); 1 more op(s) not done", out)
        self.assertIn("rank 1: in seq 42 ALLREDUCE 'grad.fc2' of set 0 (submitted", out)

    def test_reordered_op_names_the_other_seq(self):
        write(self.dir, make_dump(0, 2, [op(0, "a", "submitted"), op(1, "b", "submitted")]))
        write(self.dir, make_dump(1, 2, [op(0, "b", "submitted"), op(1, "a", "submitted")]))
        out = self.analyse()
        self.assertIn("rank 1 never submitted seq 0 ALLREDUCE 'a' of set 0; rank 0 is waiting "
                      "in it; rank 1 submitted it as seq 1; rank 1 submitted 'b' as seq 0 "
                      "instead", out)

    def test_dead_rank(self):
        for r in (0, 1, 3):
            write(self.dir, make_dump(r, 4, grads(3) + [op(3, "grad.3", "submitted")]))
        out = self.analyse()
        self.assertIn("job job-a: 3 of 4 ranks dumped", out)
        self.assertIn("no dump from rank(s) 2 (dead, or never reached a dump)", out)
        self.assertIn("set 0: all 3 members agree on seqs 0..3 (no dump from rank 2)", out)
        self.assertIn("rank 1: in seq 3 ALLREDUCE 'grad.3' of set 0 (submitted", out)

    def test_stuck_rank(self):
        for r in (0, 2):
            write(self.dir, make_dump(r, 3, grads(7) + [op(7, "grad.7", "submitted")]))
        write(self.dir, make_dump(1, 3, grads(7)))
        out = self.analyse()
        self.assertIn("rank 1 never submitted seq 7 ALLREDUCE 'grad.7' of set 0; ranks 0,2 are "
                      "waiting in it; rank 1's newest op of set 0 is seq 6 'grad.6' (done)", out)
        self.assertIn("rank 1: idle, last op seq 6 ALLREDUCE 'grad.6' of set 0 done", out)

    def test_a_signals_dump_beside_an_errors_is_not_read(self):
        # A rank that dumped on a stall and then got SIGTERM (a peer's MPI_Abort) keeps the
        # stall's rank<R>.json; the signal's goes to rank<R>.SIGTERM.json, which says less.
        for r in (0, 2):
            write(self.dir, make_dump(r, 3, grads(7) + [op(7, "grad.7", "submitted")],
                                      reason="Stalled: rank 1 never submitted"))
        write(self.dir, make_dump(1, 3, grads(7), reason="Stalled: rank 1 never submitted"))
        write(self.dir, make_dump(1, 3, grads(3), reason="SIGTERM"), name="rank1.SIGTERM.json")
        out = self.analyse()
        self.assertIn("job job-a: 3 of 3 ranks dumped", out)
        self.assertIn("rank 1 on node1 pid 1001 at 100.0 s: Stalled: rank 1 never submitted",
                      out)
        self.assertIn("rank 1 never submitted seq 7 ALLREDUCE 'grad.7' of set 0", out)
        self.assertNotIn("SIGTERM", out)

    def test_completed_holders_are_listed_with_states(self):
        write(self.dir, make_dump(0, 3, grads(2)))
        write(self.dir, make_dump(1, 3, grads(1) + [op(1, "grad.1", "executing")]))
        write(self.dir, make_dump(2, 3, grads(1)))
        out = self.analyse()
        self.assertIn("rank 2 never submitted seq 1 ALLREDUCE 'grad.1' of set 0; ranks 0,1 hold "
                      "it (states: rank 0 done, rank 1 executing)", out)

    def test_mismatched_shapes(self):
        write(self.dir, make_dump(0, 3, grads(7) + [op(7, "x", "submitted", shape=(4, 3))]))
        write(self.dir, make_dump(1, 3, grads(7) + [op(7, "x", "submitted", shape=(5, 3))]))
        write(self.dir, make_dump(2, 3, grads(7) + [op(7, "x", "submitted", shape=(4, 3))]))
        out = self.analyse()
        self.assertIn("seq 7 'x' of set 0: shapes differ: ranks 0,2 [4, 3], rank 1 [5, 3]", out)
        self.assertNotIn("dtypes differ", out)

    def test_mismatched_dtypes_and_ops(self):
        write(self.dir, make_dump(0, 2, [op(0, "x", "submitted", dtype="float32")]))
        write(self.dir, make_dump(1, 2, [op(0, "x", "submitted", dtype="int64",
                                            kind="BROADCAST")]))
        out = self.analyse()
        self.assertIn("seq 0 'x' of set 0: ops differ: rank 0 ALLREDUCE, rank 1 BROADCAST; "
                      "dtypes differ: rank 0 float32, rank 1 int64", out)

    def test_names_disagree(self):
        write(self.dir, make_dump(0, 3, grads(5) + [op(5, "a", "submitted")]))
        for r in (1, 2):
            write(self.dir, make_dump(r, 3, grads(5) + [op(5, "b", "submitted")]))
        out = self.analyse()
        self.assertIn("ranks disagree at seq 5 of set 0: rank 0 'a', ranks 1,2 'b'", out)

    def test_ring_truncation(self):
        # Rank 0 kept seqs 50..99 of 100, rank 1 seqs 30..99, rank 2 all 0..98: only 50.. is
        # compared, and rank 2 never submitted seq 99.
        write(self.dir, make_dump(0, 3, grads(99, start=50) + [op(99, "grad.99", "submitted")],
                                  capacity=50, recorded=100))
        write(self.dir, make_dump(1, 3, grads(99, start=30) + [op(99, "grad.99", "submitted")],
                                  capacity=70, recorded=100))
        write(self.dir, make_dump(2, 3, grads(99)))
        out = self.analyse()
        self.assertIn("rank 0 on node0 pid 1000 at 100.0 s: stall: collectives waiting "
                      "(ring kept the last 50 of 100 ops)", out)
        self.assertIn("rank 2 never submitted seq 99 ALLREDUCE 'grad.99' of set 0; ranks 0,1 "
                      "are waiting in it", out)
        findings = json.loads(self.analyse("--json"))
        self.assertEqual(findings["sets"]["0"]["first_divergence"]["seq"], 99)

    def test_truncated_rings_that_agree(self):
        write(self.dir, make_dump(0, 2, grads(100, start=60), capacity=40, recorded=100))
        write(self.dir, make_dump(1, 2, grads(100, start=20), capacity=80, recorded=100))
        self.assertIn("set 0: all 2 members agree on seqs 60..99", self.analyse())

    def test_only_the_diverging_set_blames_its_members(self):
        # Set 1 is {1, 3}: rank 3 never submitted its seq 2. Rank 0 and 2 are no members of set 1
        # and submitted nothing to it; set 0 agrees.
        sets = {"0": [0, 1, 2, 3], "1": [1, 3]}
        base = grads(3)
        sub = [op(s, f"sub.{s}", set_id=1) for s in range(2)]
        write(self.dir, make_dump(0, 4, base, sets=sets))
        write(self.dir, make_dump(2, 4, base, sets=sets))
        write(self.dir, make_dump(1, 4, base + sub + [op(2, "sub.2", "submitted", set_id=1)],
                                  sets=sets))
        write(self.dir, make_dump(3, 4, base + sub, sets=sets))
        out = self.analyse()
        self.assertIn("set 0: all 4 members agree on seqs 0..2", out)
        self.assertIn("rank 3 never submitted seq 2 ALLREDUCE 'sub.2' of set 1; rank 1 is "
                      "waiting in it", out)
        self.assertNotIn("rank 0 never", out)
        self.assertNotIn("rank 2 never", out)
        self.assertEqual(out.count("never submitted"), 1)

    def test_members_disagree_uses_the_union(self):
        write(self.dir, make_dump(0, 3, [op(0, "s", set_id=1)], sets={"1": [0, 1]}))
        write(self.dir, make_dump(1, 3, [op(0, "s", set_id=1)], sets={"1": [0, 1, 2]}))
        write(self.dir, make_dump(2, 3, [], sets={"1": [0, 1, 2]}))
        out = self.analyse()
        self.assertIn("set 1: ranks disagree on its members (rank 0 says 0,1; ranks 1,2 say "
                      "0,1,2); using the union 0,1,2", out)
        self.assertIn("rank 2 never submitted seq 0 ALLREDUCE 's' of set 1", out)
        self.assertIn("rank 2: idle, no ops recorded", out)

    def test_two_jobs(self):
        write(self.dir, make_dump(0, 2, grads(3), job="old"), mtime=1000)
        write(self.dir, make_dump(1, 2, grads(3), job="old"), mtime=1000)
        write(self.dir, make_dump(2, 3, grads(4), job="new"), mtime=2000)
        out = self.analyse()
        self.assertIn("job new: 1 of 3 ranks dumped", out)
        self.assertIn("no dump from rank(s) 0,1 (dead, or never reached a dump)", out)
        self.assertIn("ignored 2 dump(s) of other job(s): job old: rank0.json, rank1.json", out)
        out = self.analyse("--job", "old")
        self.assertIn("job old: 2 of 2 ranks dumped", out)
        self.assertIn("ignored 1 dump(s) of other job(s): job new: rank2.json", out)
        status, _, err = run(self.dir, "--job", "nope")
        self.assertEqual(status, 2)
        self.assertIn("no dump of job nope", err)

    def test_corrupt_dump_is_named_and_skipped(self):
        write(self.dir, make_dump(0, 3, grads(2)))
        write(self.dir, make_dump(1, 3, grads(2)))
        text = json.dumps(make_dump(2, 3, grads(2)))
        with open(os.path.join(self.dir, "rank2.json"), "w") as f:
            f.write(text[:len(text) // 2])  # truncated mid-write
        with open(os.path.join(self.dir, "notes.txt"), "w") as f:
            f.write("not a dump")
        status, out, err = run(self.dir)
        self.assertEqual(status, 0)
        self.assertIn("rank2.json: not valid JSON", err)
        self.assertIn("skipped unreadable dump rank2.json: not valid JSON", out)
        self.assertIn("job job-a: 2 of 3 ranks dumped", out)
        self.assertIn("no dump from rank(s) 2", out)
        self.assertNotIn("notes.txt", out + err)

    def test_wrong_format_is_unreadable(self):
        write(self.dir, {"format": "something-else"}, name="rank0.json")
        status, out, err = run(self.dir)
        self.assertEqual(status, 2)
        self.assertIn("rank0.json: not a tutti-flight-recorder dump", err)
        self.assertIn("no readable flight-recorder dump", err)

    def test_empty_dir(self):
        status, out, err = run(self.dir)
        self.assertEqual(status, 2)
        self.assertEqual(out, "")
        self.assertIn("no flight-recorder dump (rank<R>.json) in", err)

    def test_failed_op_error(self):
        failed = op(2, "grad.2", "failed", error="Stalled: ranks 1 did not submit")
        write(self.dir, make_dump(0, 2, grads(2) + [failed], reason="error: Stalled"))
        write(self.dir, make_dump(1, 2, grads(2) + [op(2, "grad.2", "failed", error="x")]))
        out = self.analyse()
        self.assertIn("rank 0: seq 2 ALLREDUCE 'grad.2' of set 0 failed: Stalled: ranks 1 did "
                      "not submit", out)
        self.assertIn("rank 0: idle, last op seq 2 ALLREDUCE 'grad.2' of set 0 failed", out)

    def test_json_output(self):
        for r in (0, 1):
            write(self.dir, make_dump(r, 3, grads(3) + [op(3, "grad.3", "submitted", at=90.0)]))
        findings = json.loads(self.analyse("--json"))
        self.assertEqual(findings["job"], "job-a")
        self.assertEqual(findings["size"], 3)
        self.assertEqual(findings["dumped"], [0, 1])
        self.assertEqual(findings["missing"], [2])
        self.assertEqual(findings["other_jobs"], {})
        self.assertIsNone(findings["sets"]["0"]["first_divergence"])
        last = findings["ranks"]["1"]["last"]
        self.assertEqual((last["sequence"], last["name"], last["state"]), (3, "grad.3",
                                                                           "submitted"))
        self.assertAlmostEqual(last["age_s"], 10.0)

    def test_subprocess(self):
        write(self.dir, make_dump(0, 2, grads(2) + [op(2, "grad.2", "submitted")]))
        write(self.dir, make_dump(1, 2, grads(2)))
        result = subprocess.run([sys.executable, TRACE, self.dir], capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("rank 1 never submitted seq 2 ALLREDUCE 'grad.2' of set 0", result.stdout)
        result = subprocess.run([sys.executable, TRACE], capture_output=True, text=True,
                                timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("usage: tutti-trace", result.stderr)


if __name__ == "__main__":
    unittest.main()
