"""The results lock tells its live holder from a reused pid; SIGTERM stops a sweep like Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from harness.config.errors import SweepError
from harness.execution.lock import ResultsLock, process_start
from harness.execution.store import read_record

from .conftest import REPO

pytestmark = pytest.mark.long  # make test-long: process lifecycle, minutes (Makefile)

HOST = socket.gethostname()
STAMP = "2024-01-01T00:00:00"


@pytest.fixture
def sleeper():
    """A live child process that is not cl-bench; killed at teardown."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield proc
    proc.kill()
    proc.wait(10)


def _take(folder, line: str):
    """Write a lock file with `line`, then take the lock: the notes it logged."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".lock").write_text(line + "\n")
    notes = []
    with ResultsLock(folder, log=notes.append):
        assert (folder / ".lock").read_text().split()[0] == str(os.getpid())
    assert not (folder / ".lock").exists()
    return notes


def test_a_lock_naming_our_own_pid_is_taken_over(tmp_path):
    notes = _take(tmp_path, f"{os.getpid()} {HOST} {STAMP}")
    assert notes == [f"note: taking over a stale lock {tmp_path / '.lock'} (pid {os.getpid()} is this process)"]


def test_a_lock_naming_pid_1_with_another_start_time_is_taken_over(tmp_path):
    start = process_start(1)
    assert start is not None
    notes = _take(tmp_path, f"1 {HOST},start={start + 12345} {STAMP}")
    assert notes == [f"note: taking over a stale lock {tmp_path / '.lock'} "
                     "(pid 1 is now another process (its start time differs))"]


def test_an_old_lock_naming_a_live_process_that_is_not_cl_bench_is_taken_over(tmp_path, sleeper):
    notes = _take(tmp_path, f"{sleeper.pid} {HOST} {STAMP}")  # the old three-field format
    assert notes == [f"note: taking over a stale lock {tmp_path / '.lock'} "
                     f"(pid {sleeper.pid} is now another process (not cl-bench))"]
    assert sleeper.poll() is None


def test_a_lock_whose_live_holder_has_the_same_start_time_blocks(tmp_path, sleeper):
    lock = tmp_path / ".lock"
    lock.write_text(f"{sleeper.pid} {HOST},start={process_start(sleeper.pid)} {STAMP}\n")
    with pytest.raises(SweepError) as info:
        with ResultsLock(tmp_path, log=print):
            pass
    assert str(info.value) == (f"{tmp_path}: locked by another cl-bench run (pid {sleeper.pid}, started "
                               f"{STAMP}); wait for it to finish or stop it")
    assert lock.read_text().split()[0] == str(sleeper.pid)  # the loser touched nothing


def test_a_lock_this_process_holds_blocks_a_second_taker_here(tmp_path):
    with ResultsLock(tmp_path, log=print):
        with pytest.raises(SweepError, match="locked by another cl-bench run"):
            with ResultsLock(tmp_path, log=print):
                pass
        assert (tmp_path / ".lock").exists()


GRID = 8  # 2 regimes x 2 methods x 2 task orders


def _sweep_command(tmp_path):
    proto = tmp_path / "tiny.yaml"
    proto.write_text(textwrap.dedent("""\
        name: tiny
        version: "1"
        datasets: [{name: digits, n_tasks: 2, classes_per_task: 2, model: mlp}]
        regimes: [head, full]
        methods: [naive, lwf]
        task_orders: {count: 2, seed: 0}
        training: {epochs: 1, batch_size: 32}
        """))
    return [sys.executable, "-m", "harness.cli", "run", "--protocol", str(proto), "--results",
            str(tmp_path / "res"), "--no-mlflow", "--no-progress", "--no-leaderboard", "--jobs", "1"]


@pytest.mark.slow
def test_sigterm_stops_a_sweep_like_ctrl_c_and_the_same_command_resumes(tmp_path):
    cmd = _sweep_command(tmp_path)
    empty = tmp_path / "no-submissions"
    empty.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CL_BENCH_SUBMISSIONS": str(empty)}
    folder = tmp_path / "res" / "tiny"
    runs = folder / "runs"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not any(runs.glob("*.json")):
            time.sleep(0.01)
        assert proc.poll() is None, proc.stdout.read()
        proc.send_signal(signal.SIGTERM)  # the driver only, as `docker stop` or a scheduler does
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 143, out  # 128 + SIGTERM, as the CLI maps SweepResult.signal
    assert "interrupted (SIGTERM)" in out
    assert not (folder / ".lock").exists()
    saved = sorted(runs.glob("*.json"))
    assert 1 <= len(saved) < GRID
    for path in saved:
        json.loads(path.read_text())
        assert read_record(path)[1] is None, path.name

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"done: {len(saved)}   to run: {GRID - len(saved)}" in done.stdout
    assert len(list(runs.glob("*.json"))) == GRID
