"""End-to-end sweeps: smoke grid, resume after a kill, rerun of corrupt records, dry run."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.errors import SweepError
from harness.execution.store import read_record, scan_runs

ROOT = Path(__file__).resolve().parent.parent
SMOKE_RUNS = 8


def run_cli(*argv):
    return main(["run", "--protocol", "smoke", "--no-progress", "--no-leaderboard", *argv])


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    results = tmp_path_factory.mktemp("smoke")
    os.chdir(ROOT)
    assert run_cli("--results", str(results), "--jobs", "1") == 0
    return results


@pytest.mark.slow
def test_smoke_sweep_writes_one_valid_record_per_run(smoke_results, capsys):
    scan = scan_runs(smoke_results / "smoke" / "runs")
    assert len(scan.valid) == SMOKE_RUNS and not scan.invalid and not scan.stray
    assert {r.status for r in scan.valid.values()} == {"ok"}
    assert {r.spec.regime for r in scan.valid.values()} == {"head", "full"}


@pytest.mark.slow
def test_rerun_skips_finished_runs(smoke_results, capsys):
    before = {p: p.stat().st_mtime_ns for p in (smoke_results / "smoke" / "runs").glob("*.json")}
    assert run_cli("--results", str(smoke_results)) == 0
    out = capsys.readouterr().out
    assert f"done: {SMOKE_RUNS}   to run: 0" in out
    after = {p: p.stat().st_mtime_ns for p in (smoke_results / "smoke" / "runs").glob("*.json")}
    assert before == after


@pytest.mark.slow
def test_dry_run_prints_the_grid(smoke_results, capsys):
    assert run_cli("--results", str(smoke_results), "--dry-run", "--regimes", "full") == 0
    out = capsys.readouterr().out
    assert "1 datasets x 1 regimes x 2 methods x 2 task orders x 1 seeds = 4 runs" in out
    assert "done: 4   to run: 0" in out


@pytest.mark.slow
def test_corrupt_and_stray_files_are_detected_and_redone(smoke_results, tmp_path, capsys):
    import shutil

    results = tmp_path / "copy"
    shutil.copytree(smoke_results, results)
    runs = results / "smoke" / "runs"
    victim = sorted(runs.glob("*.json"))[0]
    victim.write_text(victim.read_text()[:100])  # truncated JSON
    edited = sorted(runs.glob("*.json"))[1]
    data = json.loads(edited.read_text())
    data["spec"]["seed"] = 99  # no longer hashes to its run id
    edited.write_text(json.dumps(data))
    (runs / ".abc.json.tmp-123").write_text("{")
    assert run_cli("--results", str(results)) == 0
    out = capsys.readouterr().out
    assert "to run: 2" in out
    scan = scan_runs(runs)
    assert len(scan.valid) == SMOKE_RUNS and not scan.invalid and not scan.stray


@pytest.mark.slow
@pytest.mark.long  # make test-long: a sweep process killed and resumed
def test_resume_after_the_sweep_process_is_killed(tmp_path):
    results = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "harness.cli", "run", "--protocol", "smoke", "--results", str(results),
           "--no-progress", "--no-leaderboard", "--jobs", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    runs = results / "smoke" / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(runs.glob("*.json"))) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert 2 <= len(first) < SMOKE_RUNS
    assert all(read_record(runs / name)[1] is None for name in first)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"done: {len(first)}   to run: {SMOKE_RUNS - len(first)}" in done.stdout
    assert "taking over a stale lock" in done.stdout
    scan = scan_runs(runs)
    assert len(scan.valid) == SMOKE_RUNS and not scan.invalid
    assert all((runs / n).stat().st_mtime_ns == t for n, t in first.items())  # nothing redone


@pytest.mark.slow
def test_jobs_two_gives_the_same_records_as_inline(smoke_results, tmp_path):
    results = tmp_path / "par"
    assert run_cli("--results", str(results), "--jobs", "2", "--orders", "1") == 0
    par = scan_runs(results / "smoke" / "runs").valid
    ref = scan_runs(smoke_results / "smoke" / "runs").valid
    assert len(par) == 4
    for run_id, rec in par.items():
        assert rec.acc_matrix == ref[run_id].acc_matrix
        assert rec.metrics == ref[run_id].metrics


def test_a_view_shows_one_version_and_leaves_out_clashing_cells():
    from conftest import record_from

    from harness.execution.views import view_records

    def rec(run_id, version, lam, order=0):
        return record_from({"run_id": run_id, "spec": {
            "protocol_version": version, "dataset": {"name": "d", "n_tasks": 5, "classes_per_task": 2, "model": "mlp"},
            "regime": "full", "label": "", "method": "si", "hparams": {"si_lambda": lam}, "order": order, "seed": 0}})

    notes = []
    kept = view_records([rec("a", "1", 1.0), rec("b", "2", 1.0), rec("c", "10", 1.0)], log=notes.append)
    assert [r.run_id for r in kept] == ["c"]  # 10 is newer than 2 (numeric, not string order)
    assert notes == ["protocol test version 10: 1 records (version(s) 1, 2 left out: 2 records; "
                     "--protocol-version chooses)"]
    assert [r.run_id for r in view_records(kept + [rec("a", "1", 1.0)], version="1", log=notes.append)] == ["a"]
    notes.clear()
    # a protocol edited without a version bump: two settings in one cell are never averaged
    kept = view_records([rec("a", "1", 1.0), rec("b", "1", 1000.0), rec("c", "1", 1.0, order=1)],
                        log=notes.append)
    assert [r.run_id for r in kept] == ["c"]
    assert len(notes) == 2 and notes[1].startswith("warning: 1 cells hold several records")
    assert "left out rather than averaged" in notes[1]
    # with the protocol's grid the stale setting is simply not shown
    kept = view_records([rec("a", "1", 1.0), rec("b", "1", 1000.0)], grid={"b"}, log=notes.append)
    assert [r.run_id for r in kept] == ["b"] and "outside this grid" in notes[-1]
    # given the grid's specs, the note names the setting that differs
    kept = view_records([rec("a", "1", 1.0), rec("b", "1", 1000.0)], grid={"b": rec("b", "1", 1000.0).spec},
                        log=notes.append)
    assert [r.run_id for r in kept] == ["b"] and "hparams.si_lambda 1.0 vs 1000.0" in notes[-1]
    with pytest.raises(SweepError, match="--protocol-version: protocol 'test' has no records of version '7'"):
        view_records(kept, version="7")
