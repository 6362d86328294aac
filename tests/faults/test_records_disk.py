"""Damaged records and unwritable or full results folders.

Documented behaviour (README, "Results layout"): an invalid record file is reported with its
reason, never read into tables or the leaderboard, and its run is redone (the file is
overwritten); temp files left by a killed writer are removed under the lock.
"""
from __future__ import annotations

import csv
import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from harness.config.files import TMP_MARK
from harness.execution.store import load_records, scan_runs

from .conftest import tiny_protocol

pytestmark = pytest.mark.slow  # every test here trains real models (runs, sweeps)

QUIET = ("--no-progress", "--no-mlflow", "--jobs", "1")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-run sweep of the tiny protocol (read-only: copy before damaging)."""
    from harness.cli import main

    folder = tmp_path_factory.mktemp("finished")
    proto = tiny_protocol(folder, orders=2)
    assert main(["run", "--protocol", str(proto), "--results", str(folder / "res"), "--no-leaderboard",
                 *QUIET]) == 0
    return proto, folder / "res"


def _damage(runs: Path) -> dict:
    """Damage three of the four records in three ways and drop a stray temp file; {kind: path}."""
    paths = sorted(runs.glob("*.json"))
    truncated, foreign, edited, intact = paths
    truncated.write_text(truncated.read_text()[:200])
    data = json.loads(foreign.read_text())
    data["schema_version"] = 99
    foreign.write_text(json.dumps(data))
    data = json.loads(edited.read_text())
    data["spec"]["training"]["lr"] = 1.0  # a "better" number typed in by hand
    data["metrics"]["acc"] = 1.0
    edited.write_text(json.dumps(data))
    stray = runs / f".{intact.stem}.json{TMP_MARK}424242"
    stray.write_text('{"half": ')
    return {"truncated": truncated, "foreign": foreign, "edited": edited, "intact": intact, "stray": stray}


REASONS = {"truncated": "not valid JSON (truncated?)", "foreign": "schema_version 99: written by another cl-bench",
           "edited": "its spec does not hash to its run_id"}
KIND = {"truncated": "invalid", "foreign": "foreign", "edited": "invalid"}


def test_damaged_records_are_reported_never_counted_and_redone(finished, tmp_path, cli):
    proto, original = finished
    results = tmp_path / "res"
    shutil.copytree(original, results)
    runs = results / "tiny" / "runs"
    before = {p.name: json.loads(p.read_text()) for p in runs.glob("*.json")}
    files = _damage(runs)
    intact_stat = files["intact"].stat()

    scan = scan_runs(runs)
    reasons = {p.name: r for p, r in scan.invalid + scan.foreign}
    for kind, text in REASONS.items():
        assert text in reasons[files[kind].name], reasons
    assert scan.stray == [files["stray"]] and list(scan.valid) == [files["intact"].stem]
    assert [r.run_id for r in load_records(results, "tiny")] == [files["intact"].stem]

    code, out, err = cli("leaderboard", "--results", results, "--protocol", "tiny", "--out", tmp_path / "site")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "site" / "data" / "runs.csv").open()))
    assert [r["run_id"] for r in rows] == [files["intact"].stem]  # the damaged ones are not on the board

    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", *QUIET)
    assert code == 0, err
    assert "done: 1   to run: 3" in out and "invalid record files (will be redone): 2" in out
    assert "foreign record files (never counted): 1" in out
    for kind, text in REASONS.items():
        assert f"note: {files[kind]} is {KIND[kind]} ({text}" in out
    scan = scan_runs(runs)
    assert len(scan.valid) == 4 and not scan.invalid and not scan.stray
    now = files["intact"].stat()
    assert (now.st_ino, now.st_mtime_ns) == (intact_stat.st_ino, intact_stat.st_mtime_ns)
    for name, rec in before.items():  # redone runs reproduce the original numbers exactly
        assert scan.valid[rec["run_id"]].acc_matrix == rec["acc_matrix"], name


@pytest.mark.parametrize("kind", ["file", "sysfs", "chmod"])
def test_unwritable_results_folder_fails_before_any_run(kind, finished, tmp_path, cli, monkeypatch):
    proto, _ = finished
    if kind == "file":
        results = tmp_path / "a-file"
        results.write_text("not a folder")
    elif kind == "sysfs":
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no /sys on this machine")
        results = Path("/sys/cl-bench-results")  # even root cannot create folders there
    else:
        if os.geteuid() == 0:
            pytest.skip("running as root: chmod does not stop root from writing (file and sysfs cases cover it)")
        results = tmp_path / "ro"
        results.mkdir()
        results.chmod(0o500)
    calls = []
    monkeypatch.setattr("harness.run.engine.run_one", lambda *a, **k: calls.append(a))
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", *QUIET)
    assert code == 2 and not calls
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "results folder is not writable" in lines[0] and str(results) in lines[0], err


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_at_the_first_record_write(finished, tmp_path, cli, monkeypatch):
    proto, _ = finished
    results = tmp_path / "res"
    monkeypatch.setattr("harness.config.files.os.fsync", _enospc)  # the record's bytes do not fit
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", *QUIET)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and "cannot write the record" in lines[0]
    # No partial record, no temp file, no lock; the folders the sweep made are removed with it.
    assert [p for p in results.rglob("*") if not p.is_dir()] == []
    assert not (results / "tiny" / "runs").exists()


def test_full_disk_before_any_run(finished, tmp_path, cli, monkeypatch):
    proto, _ = finished
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name.startswith(".write-probe"):
            _enospc()
        return real(self, *args, **kwargs)

    calls = []
    monkeypatch.setattr(Path, "write_text", write_text)
    monkeypatch.setattr("harness.run.engine.run_one", lambda *a, **k: calls.append(a))
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-leaderboard", *QUIET)
    assert code == 2 and not calls
    assert "results folder is not writable (No space left on device)" in err.strip()
    assert len(err.strip().splitlines()) == 1
