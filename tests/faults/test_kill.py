"""SIGKILL on the whole process group at seeded random points, resume, and compare with an unkilled sweep.

Sweeps are forked from a pre-imported zygote (tests/faults/zygote.py) so a kill costs a fork,
not a torch import. Half the kills land at a random moment; the other half inside a record
write (the child's fsync is slowed and announced through a marker file), which must leave a
temp file and never a partial record.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.tables import analyse
from harness.config.files import TMP_MARK
from harness.execution.store import load_records, read_record, scan_runs

from .conftest import REPO, tiny_protocol

pytestmark = [pytest.mark.slow, pytest.mark.long]  # real sweeps killed at random points; make test-long

SEED = 9
KILLS = 12
RUNS = 16  # digits, 2 regimes x 2 methods x 4 task orders
WRITE_DELAY = 0.3
SWEEP = ("--no-progress", "--no-mlflow", "--no-leaderboard", "--jobs", "1")


class Zygote:
    """Client of zygote.py: fork sweeps, reap them."""

    def __init__(self, proc):
        self.proc = proc

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def fork(self, argv, log, marker=None, write_delay=0.0) -> int:
        return self._ask({"op": "fork", "argv": [str(a) for a in argv], "log": str(log),
                          "marker": str(marker) if marker else None, "write_delay": write_delay})["pid"]

    def wait(self, pid: int) -> int:
        return self._ask({"op": "wait", "pid": pid})["code"]


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    empty = tmp_path_factory.mktemp("no-submissions")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CL_BENCH_SUBMISSIONS": str(empty)}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py"))], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert "ready" in json.loads(proc.stdout.readline())
    yield Zygote(proc)
    proc.stdin.close()
    proc.wait(60)


def _wait_for(condition, timeout=60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _finished(log: Path) -> bool:
    return log.exists() and ("runs finished" in log.read_text() or "error" in log.read_text())


def _check_runs(runs: Path, seen: dict) -> None:
    """Every record file valid and unique; records seen before are untouched (not recomputed)."""
    files = sorted(runs.glob("*.json")) if runs.is_dir() else []
    for path in files:
        data, problem = read_record(path)
        assert problem is None, f"{path.name}: {problem}"
    assert len({p.stem for p in files}) == len(files)
    for path in files:
        st = path.stat()
        key = (st.st_ino, st.st_mtime_ns)
        assert seen.setdefault(path.name, key) == key, f"{path.name} was rewritten"


def test_sweep_survives_random_sigkills_and_matches_an_unkilled_sweep(zygote, tmp_path):
    proto = tiny_protocol(tmp_path, methods=("naive", "lwf"), regimes=("head", "full"), orders=4)
    results, rng, seen = tmp_path / "killed", random.Random(SEED), {}
    runs = results / "tiny" / "runs"
    kills = mid_write = 0
    for cycle in range(3 * KILLS):
        if kills >= KILLS:
            break
        marker, log = tmp_path / f"marker-{cycle}", tmp_path / f"log-{cycle}"
        pid = zygote.fork(["run", "--protocol", proto, "--results", results, *SWEEP], log, marker, WRITE_DELAY)
        in_write = rng.random() < 0.5
        if in_write:  # inside the k-th record write of this cycle
            k = rng.randint(1, 2)
            in_write = _wait_for(lambda marker=marker, k=k, log=log: _lines(marker) >= k or _finished(log))
            in_write = in_write and _lines(marker) >= k
            time.sleep(rng.uniform(0.0, WRITE_DELAY * 0.6))
        else:
            time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(pid, signal.SIGKILL)  # a zombie leader still owns its group: always succeeds
        code = zygote.wait(pid)
        assert code in (0, -signal.SIGKILL), log.read_text()
        _check_runs(runs, seen)
        if code == 0:
            break  # the sweep finished before the kill
        kills += 1
        if in_write:
            mid_write += 1
            assert any(TMP_MARK in p.name for p in runs.iterdir()), "a kill inside a write leaves its temp file"
    assert kills >= 10 and mid_write >= 3, (kills, mid_write)
    assert len(seen) < RUNS, "the kills left nothing to resume"

    final = tmp_path / "log-final"
    assert zygote.wait(zygote.fork(["run", "--protocol", proto, "--results", results, *SWEEP], final)) == 0, \
        final.read_text()
    out = final.read_text()
    assert f"done: {len(seen)}   to run: {RUNS - len(seen)}" in out
    _check_runs(runs, seen)
    scan = scan_runs(runs)
    assert len(scan.valid) == RUNS and not scan.invalid and not scan.stray

    ref_log = tmp_path / "log-ref"
    ref = tmp_path / "reference"
    assert zygote.wait(zygote.fork(["run", "--protocol", proto, "--results", ref, *SWEEP], ref_log)) == 0
    _assert_same_tables(load_records(results, "tiny"), load_records(ref, "tiny"))
    print(f"\nkills survived: {kills} ({mid_write} inside a record write)")


def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    # what varies between runs of one spec: seconds, the host, and the process's peak memory (provenance.memory)
    drop = [c for c in df.columns if "time" in c or c.endswith("_s") or c.endswith("_bytes") and "peak" in c
            or c in ("hostname", "started")]
    df = df.drop(columns=drop)
    keys = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (str, int))).all()]
    return df.sort_values(keys).reset_index(drop=True) if keys else df.reset_index(drop=True)


def _assert_same_tables(killed: list, reference: list) -> None:
    assert sorted(r.run_id for r in killed) == sorted(r.run_id for r in reference)
    ref_by_id = {r.run_id: r for r in reference}
    for rec in killed:
        assert rec.acc_matrix == ref_by_id[rec.run_id].acc_matrix
        assert rec.metrics == ref_by_id[rec.run_id].metrics
    a, b = analyse(killed).tables(), analyse(reference).tables()
    for name in a:
        pd.testing.assert_frame_equal(_comparable(a[name]), _comparable(b[name]), obj=name)


def test_second_sweep_is_locked_out_then_the_stale_lock_is_taken_over(zygote, tmp_path, cli,
                                                                        bad_method_files):
    proto = tiny_protocol(tmp_path, methods=("naive", "hangs"), regimes=("head",))
    results = tmp_path / "res"
    runs, lock = results / "tiny" / "runs", results / "tiny" / ".lock"
    argv = ["run", "--protocol", proto, "--results", results, "--method", bad_method_files["hangs"], *SWEEP]
    pid = zygote.fork(argv, tmp_path / "log-first")
    assert _wait_for(lambda: lock.exists() and runs.is_dir() and any(runs.glob("*.json")))  # now hanging
    owner, _host, started = lock.read_text().split()
    assert int(owner) == pid
    in_flight = runs / f".abcdef123456.json{TMP_MARK}{pid}"  # as if the first were mid-write
    in_flight.write_text("{")

    code, out, err = cli(*argv)
    assert code == 2
    assert err.strip() == (f"cl-bench: error: {lock.parent}: locked by another cl-bench run (pid {pid}, "
                           f"started {started}); wait for it to finish or stop it")
    assert in_flight.exists() and lock.read_text().split()[0] == str(pid)  # the loser touched nothing

    os.killpg(pid, signal.SIGKILL)
    assert zygote.wait(pid) == -signal.SIGKILL
    code, out, err = cli(*argv, "--methods", "naive")
    assert code == 0, err
    assert f"note: taking over a stale lock {lock} (pid {pid} is gone)" in out
    assert not lock.exists() and not in_flight.exists()
