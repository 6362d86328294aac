"""Output folders cannot be written through or hidden (issue 30).

Every writer (site, export, report, figures, records, lock, MLflow's local store) refuses a
symbolic link below the folder it owns, with one line naming it and exit code 2, and writes
nothing outside (config/files.py); the results layout's names are reserved for protocols and no
output may be written into the record area (config/paths.py); `leaderboard --out` does not take
over a user's non-empty folder without --force; a write that fails (disk full) is one line naming
the file and leaves the previous files as they were and no temp file.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fixture_records

from harness.config import files
from harness.config.errors import OutputError, ProtocolError
from harness.config.files import TMP_MARK
from harness.execution.store import discover_protocol_dirs, load_records, write_record

from .conftest import deadline, tiny_protocol

FIXTURE = Path(__file__).parents[1] / "fixtures" / "analysis" / "records.json"
PROTO = "toy-proto"  # the fixture's protocol
MANIFEST = ".cl-bench-site.json"
QUIET = ("--no-progress", "--jobs", "1")
N_RECORDS = 8


def write_results(folder: Path, records) -> Path:
    """A results folder of valid records: the fixture's, with metrics, warnings and run ids recomputed."""
    from dataclasses import replace

    import numpy as np

    from harness.config.metrics import all_metrics, step_forgetting
    from harness.config.specs import SCHEMA_VERSION, run_id_of
    from harness.execution.store import runs_dir
    from harness.run.checks import run_warnings

    for r in records:
        norms = dict(r.update_norms)
        if r.ok:
            norms["step_forgetting"] = step_forgetting(np.asarray(r.acc_matrix, float))
        r = replace(r, metrics=all_metrics(r.acc_matrix, r.init_acc) if r.ok else {}, update_norms=norms,
                    warnings=run_warnings(r.acc_matrix, r.checks, r.spec.scenario), schema_version=SCHEMA_VERSION)
        write_record(runs_dir(folder, r.spec.protocol), replace(r, run_id=run_id_of(r.spec.to_dict())))
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A small results folder of valid records (two methods, two regimes: quick to analyse)."""
    records = [r for r in fixture_records(FIXTURE)
               if r.method in ("A", "B") and r.spec.regime in ("head", "full") and r.spec.order < 2]
    return write_results(tmp_path_factory.mktemp("source"), records)


@pytest.fixture
def results(source, tmp_path):
    """A fresh copy of the results folder, for one test to damage."""
    return Path(shutil.copytree(source, tmp_path / "results"))


@pytest.fixture
def outside(tmp_path):
    """A file and a folder outside every output folder: a link points here; they must stay as they are."""
    folder = tmp_path / "outside"
    folder.mkdir()
    file = tmp_path / "outside.txt"
    file.write_text("keep me")
    return file, folder


def untouched(outside) -> bool:
    file, folder = outside
    return file.read_text() == "keep me" and not any(folder.iterdir())


def one_line_error(code, err, *words) -> bool:
    lines = err.strip().splitlines()
    return code == 2 and len(lines) == 1 and lines[0].startswith("cl-bench: error:") and all(w in lines[0] for w in words)


def listing(folder: Path, files_only: bool = False) -> dict:
    """{relative path: sha256 (None for a folder or link)} of everything under folder (or its files only)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() and not p.is_symlink() else None for p in sorted(folder.rglob("*"))
            if not files_only or p.is_file() or p.is_symlink()}


def link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(target)
    return path


def fake_site(folder: Path) -> Path:
    """A folder a previous build made (its manifest, listing nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps({"files": {}}))
    return folder


# ------------------------------------------------------------------ links: the site

# (linked part of the site, to the outside file or folder, full build needed before the refusal)
SITE_LINKS = [("index.html", "file"), ("data", "folder"), ("runs", "folder"), ("data/runs.csv", "file"),
              (MANIFEST, "file"), (".", "folder")]
# Not with --out: naming a link as --out is the user's own choice; a file link deep in the site costs a
# whole build, and the default target's case covers it.
NOT_WITH_OUT = (".", "data/runs.csv")


@pytest.mark.parametrize("part, kind, target", [(p, k, "default") for p, k in SITE_LINKS] +
                         [(p, k, "out") for p, k in SITE_LINKS if p not in NOT_WITH_OUT])
def test_leaderboard_never_writes_through_a_link_in_the_site(part, kind, target, results, outside, tmp_path, cli):
    site = fake_site(results / PROTO / "site" if target == "default" else tmp_path / "site")
    link(site / part, outside[0] if kind == "file" else outside[1])
    argv = ["--out", site] if target == "out" else []
    code, out, err = cli("leaderboard", "--results", results, "--protocol", PROTO, *argv)
    assert one_line_error(code, err, "symbolic link", str(site / part).rstrip("/.")), err
    assert untouched(outside)
    assert not [p for p in site.rglob(f"*{TMP_MARK}*")]


# ------------------------------------------------------------------ links: export, report, figures

def _figure_name() -> str:
    from harness.outputs.figures import FIGURES
    from harness.outputs.formatting import slug

    return f"{slug('toy')}-{next(iter(FIGURES))}.png"


@pytest.mark.parametrize("command, dest, linked, kind", [
    ("export", None, "records.csv", "file"),                                  # the default target
    ("export", f"{PROTO}/tables/x.csv", f"{PROTO}/tables", "folder"),         # a folder below --results
    ("export", "@/mine/x.csv", "@/mine/x.csv", "file"),                      # the user's own folder
    ("report", "@/paper/r.md", "@/paper/r.md", "file"),
    ("report", f"{PROTO}/paper/r.md", f"{PROTO}/paper", "folder"),
    ("figures", "@/figs", f"@/figs/{_figure_name()}", "file"),
    ("figures", f"{PROTO}/figs", f"{PROTO}/figs", "folder"),
])
def test_paper_outputs_never_write_through_a_link(command, dest, linked, kind, results, outside, tmp_path, cli):
    def place(rel):  # "@/x": under tmp_path (the user's folder), else under --results
        return tmp_path / rel[2:] if rel.startswith("@/") else results / rel

    link(place(linked), outside[0] if kind == "file" else outside[1])
    argv = {"export": [], "report": ["--format", "markdown"], "figures": ["--format", "png"]}[command]
    code, out, err = cli(command, "--results", results, *argv, *(["--out", place(dest)] if dest else []))
    assert one_line_error(code, err, "symbolic link", str(place(linked))), err
    assert untouched(outside)


# ------------------------------------------------------------------ links: records, lock, MLflow store

@pytest.fixture
def no_runs(monkeypatch):
    """run_one replaced: a test that fails before any run proves it by an empty list."""
    calls = []
    monkeypatch.setattr("harness.run.engine.run_one", lambda *a, **k: calls.append(a))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return calls


@pytest.mark.parametrize("part, kind, mlflow", [
    ("tiny", "folder", False), ("tiny/runs", "folder", False), ("tiny/.lock", "file", False),
    ("mlflow.db", "file", True), ("mlartifacts", "folder", True)])
def test_run_never_writes_records_lock_or_tracking_through_a_link(part, kind, mlflow, tmp_path, outside, no_runs,
                                                                  cli):
    proto = tiny_protocol(tmp_path)
    results = tmp_path / "res"
    link(results / part, outside[0] if kind == "file" else outside[1])
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", *QUIET,
                         *(() if mlflow else ("--no-mlflow",)))
    assert one_line_error(code, err, "symbolic link", str(results / part)), err
    assert not no_runs and untouched(outside)


@pytest.mark.parametrize("linked", ["record", "runs", "protocol"])
def test_write_record_refuses_a_link_in_its_path(linked, results, outside):
    record = load_records(results, PROTO)[0]
    folder = results / PROTO / "runs"
    target = {"record": folder / f"{record.run_id}.json", "runs": folder, "protocol": results / PROTO}[linked]
    link(target, outside[0] if linked == "record" else outside[1])
    with pytest.raises(OutputError, match="symbolic link"):
        write_record(folder, record, root=results)
    assert untouched(outside)


@pytest.mark.parametrize("rel", ["../x", "/abs/x", "a/../../x"])
def test_safe_target_refuses_paths_that_leave_the_folder(rel, tmp_path):
    with pytest.raises(OutputError, match="leaves the folder|outside"):
        files.safe_target(tmp_path / "root", rel)
    assert not (tmp_path / "x").exists() and not Path("/abs").exists()


def test_check_links_takes_plain_files_and_folders_and_refuses_links(tmp_path, outside):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mlflow.db").write_text("db")
    assert files.check_links(tmp_path, "a/mlflow.db") == tmp_path / "a" / "mlflow.db"
    assert files.check_links(tmp_path, "a/missing/deeper") == tmp_path / "a" / "missing" / "deeper"
    assert not (tmp_path / "a" / "missing").exists()  # nothing is created
    link(tmp_path / "a" / "b", outside[1])
    with pytest.raises(OutputError, match="symbolic link"):
        files.check_links(tmp_path, "a/b/c")


def test_a_link_planted_under_the_temp_name_is_not_written_through(tmp_path, outside):
    target = tmp_path / "r.json"
    link(files.temp_path(target), outside[0])
    files.write_atomic(target, "{}")
    with files.AtomicWrites() as staged:
        link(files.temp_path(tmp_path / "s.json"), outside[0])
        staged.write(tmp_path / "s.json", "{}")
    assert untouched(outside) and target.read_text() == "{}" and (tmp_path / "s.json").read_text() == "{}"


# ------------------------------------------------------------------ reserved names

RESERVED = ["runs", "RUNS", "Runs", "site", "mlflow.db", "mlartifacts", "records.csv", "Records.Parquet"]


@pytest.mark.parametrize("name", RESERVED)
def test_a_protocol_may_not_take_a_name_of_the_results_layout(name, tmp_path):
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol

    proto = tiny_protocol(tmp_path, name=name)
    with pytest.raises(ProtocolError, match=f"name: '{name}' is a name of the results folder's layout"):
        load_protocol(str(proto), get_registry())


@pytest.mark.parametrize("name", ["runs-2", "my-site", "records", "mlflow"])
def test_names_near_the_reserved_ones_load(name, tmp_path):
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol

    assert load_protocol(str(tiny_protocol(tmp_path, name=name)), get_registry()).name == name


def test_run_refuses_a_reserved_protocol_name_before_writing(results, tmp_path, no_runs, cli):
    before = listing(results)
    code, out, err = cli("run", "--protocol", tiny_protocol(tmp_path, name="runs"), "--results", results,
                         "--no-leaderboard", "--no-mlflow", *QUIET)
    assert one_line_error(code, err, "name: 'runs'"), err
    assert listing(results) == before and not no_runs
    assert discover_protocol_dirs(results) == [results / PROTO]


# ------------------------------------------------------------------ the record area

@pytest.mark.parametrize("command, dest", [
    ("leaderboard", "."), ("leaderboard", PROTO), ("leaderboard", f"{PROTO}/runs"), ("leaderboard", "new-site"),
    ("leaderboard", f"{PROTO}/runs/pages"), ("leaderboard", f"{PROTO}/../{PROTO}"), ("leaderboard", "@alias"),
    ("export", f"{PROTO}/runs/table.json"), ("export", f"{PROTO}/.lock"), ("report", f"{PROTO}/runs/r.md"),
    ("report", "mlflow.db"), ("figures", "."), ("figures", "runs"), ("figures", f"{PROTO}/runs"),
    ("figures", "mlartifacts/figs"), ("reproduce", ".")])
def test_outputs_may_not_be_written_into_the_record_area(command, dest, results, tmp_path, cli):
    if dest == "@alias":  # a link to the results folder is no way round
        dest = link(tmp_path / "alias", results)
    else:
        dest = results / dest
    before = listing(results)
    argv = {"leaderboard": [], "export": [], "report": ["--format", "markdown"], "figures": [],
            "reproduce": [load_records(results)[0].run_id]}[command]
    code, out, err = cli(command, *argv, "--results", results, "--out", dest)
    assert one_line_error(code, err, "--out:", str(dest)), err
    assert listing(results) == before
    assert discover_protocol_dirs(results) == [results / PROTO]
    assert len(load_records(results)) == N_RECORDS


def test_outputs_beside_the_records_are_allowed(results, cli):
    code, out, err = cli("export", "--results", results, "--out", results / PROTO / "tables" / "x.csv")
    assert code == 0, err
    assert len(load_records(results)) == N_RECORDS and (results / PROTO / "tables" / "x.csv").is_file()


# ------------------------------------------------------------------ a user's own folder

USER_FILES = [{"index.html": "<p>my page</p>"}, {"data/runs.csv": "my,table\n"}, {"notes.txt": "mine"},
              {"runs/a.html": "mine", "index.html": "mine"}]


@pytest.mark.parametrize("mine", USER_FILES)
def test_leaderboard_out_refuses_a_users_folder_without_force(mine, results, tmp_path, cli):
    out = tmp_path / "mine"
    for rel, text in mine.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    before = listing(out)
    code, _, err = cli("leaderboard", "--results", results, "--out", out)
    assert one_line_error(code, err, str(out), "--force", "no cl-bench site"), err
    assert listing(out) == before


def test_leaderboard_out_with_force_takes_the_folder_over(results, tmp_path, cli):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "index.html").write_text("<p>my page</p>")
    (out / "notes.txt").write_text("mine")
    code, _, err = cli("leaderboard", "--results", results, "--out", out, "--force")
    assert code == 0, err
    assert "cl-bench" in (out / "index.html").read_text() and (out / "notes.txt").read_text() == "mine"
    # now a site (the next build needs no --force); the user's file is not the site's: never pruned
    assert "notes.txt" not in json.loads((out / MANIFEST).read_text())["files"]


# ------------------------------------------------------------------ disk full

@pytest.fixture
def full_disk(monkeypatch):
    """From the `after`-th file on, a write puts half its bytes down and then fails with ENOSPC."""
    real, seen = files._write_all, []

    def install(after: int = 0):
        def write_all(fh, data):
            seen.append(1)
            if len(seen) > after:
                real(fh, data[:len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fh, data)
        monkeypatch.setattr(files, "_write_all", write_all, raising=False)  # (raising: for a run on old code)
    return install


@pytest.mark.parametrize("command, after", [("leaderboard", 5), ("export", 0),
                                            ("report", 0), ("figures", 1)])
def test_disk_full_is_one_line_and_leaves_the_previous_files(command, after, results, tmp_path, full_disk, cli):
    out = tmp_path / "out"
    out.mkdir()
    previous = {"leaderboard": {MANIFEST: json.dumps({"files": {}}), "index.html": "old"},
                "export": {"t.csv": "old"}, "report": {"r.md": "old"}, "figures": {"keep.txt": "old"}}[command]
    for rel, text in previous.items():
        (out / rel).write_text(text)
    before = listing(out, files_only=True)
    dest = {"leaderboard": out, "export": out / "t.csv", "report": out / "r.md", "figures": out}[command]
    argv = {"leaderboard": [], "export": [], "report": ["--format", "latex"], "figures": ["--format", "png"]}[command]
    full_disk(after)
    code, _, err = cli(command, "--results", results, *argv, "--out", dest)
    assert one_line_error(code, err, "No space left on device", str(out)), err
    assert listing(out, files_only=True) == before  # no half-written file, no temp file, no new file


@pytest.mark.slow
def test_a_real_write_error_mid_file_is_one_line(results, tmp_path):
    """A file-size limit (EFBIG from the kernel, halfway through a page) on the real CLI, in a subprocess."""
    out = tmp_path / "site"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "leaderboard", "--results", str(results),
                           "--out", str(out)], capture_output=True, text=True, env=env, preexec_fn=limit,
                          timeout=300)
    assert one_line_error(proc.returncode, proc.stderr, "File too large", str(out)), proc.stderr
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != MANIFEST]


# ------------------------------------------------------------------ files read from written folders: regular only

def not_regular(path: Path, kind: str, outside: Path, monkeypatch) -> str:
    """Put a `kind` (fifo, folder, socket, link to a FIFO outside) at `path`; returns the words that name it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":  # bound by a relative name: a socket's path has at most 107 bytes
        monkeypatch.chdir(path.parent)
        server = socket.socket(socket.AF_UNIX)
        server.bind(path.name)
        monkeypatch.chdir(Path(__file__).parents[2])
        return "a socket"
    else:
        os.mkfifo(outside)
        path.symlink_to(outside)
    return {"fifo": "a FIFO", "folder": "a folder", "link": "a symbolic link"}[kind]


KINDS = ("fifo", "folder", "socket", "link")


@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_that_is_not_a_regular_file_is_one_line_never_a_hang(kind, tmp_path, no_runs, cli, monkeypatch):
    proto = tiny_protocol(tmp_path)
    results = tmp_path / "res"
    lock = results / "tiny" / ".lock"
    words = not_regular(lock, kind, tmp_path / "outside-fifo", monkeypatch)
    with deadline():  # before: a FIFO (or a link to one) named .lock hung `cl-bench run` for ever
        code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", "--no-mlflow",
                             *QUIET)
    assert one_line_error(code, err, str(lock), words), err
    assert not no_runs and not (results / "tiny" / "runs").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_record_file_that_is_not_a_regular_file_is_skipped_with_a_note(kind, results, tmp_path, cli, monkeypatch):
    bad = results / PROTO / "runs" / "aaaaaaaaaaaa.json"
    words = not_regular(bad, kind, tmp_path / "outside-fifo", monkeypatch)
    with deadline():
        code, out, err = cli("export", "--results", results, "--out", tmp_path / "t.csv")
    assert code == 0, err
    notes = [line for line in (out + err).splitlines() if str(bad) in line]
    assert len(notes) == 1 and "is invalid" in notes[0] and words.removeprefix("a ") in notes[0], out + err
    assert len((tmp_path / "t.csv").read_text().splitlines()) == N_RECORDS + 1


@pytest.fixture(scope="module")
def pretrained_cache(tmp_path_factory):
    """A cache holding one dataset-pretrained backbone (built by a one-run sweep) and the protocol that uses it."""
    from harness.cli import main

    folder = tmp_path_factory.mktemp("pretrained-cache")
    proto = tiny_protocol(folder, regimes=("head",), extra="pretrain: {dataset: same, epochs: 1}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CL_BENCH_CACHE", str(folder / "cache"))
        assert main(["run", "--protocol", str(proto), "--results", str(folder / "res"), "--no-mlflow",
                     "--no-leaderboard", *QUIET]) == 0
    return proto, folder / "cache"


@pytest.mark.parametrize("part, kind", [("", k) for k in KINDS] + [(".sha256", "fifo"), (".lock", "fifo")])
def test_a_cache_file_that_is_not_a_regular_file_is_one_line_never_a_hang(part, kind, pretrained_cache, tmp_path,
                                                                         no_runs, cli, monkeypatch):
    proto, built = pretrained_cache
    cache = Path(shutil.copytree(built, tmp_path / "cache"))
    monkeypatch.setenv("CL_BENCH_CACHE", str(cache))
    [weights] = (cache / "pretrained").glob("*.pt")
    target = weights.with_name(weights.name + part)
    target.unlink(missing_ok=True)
    if part == ".lock":  # taken only to build the file: remove it
        weights.unlink()
    words = not_regular(target, kind, tmp_path / "outside-fifo", monkeypatch)
    with deadline():  # before: a FIFO in the cache hung the sweep before its first run
        code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-leaderboard",
                             "--no-mlflow", *QUIET)
    assert one_line_error(code, err, str(target), words), err
    assert not no_runs


@pytest.mark.parametrize("kind", KINDS)
def test_the_mnist1d_cache_file_is_read_only_when_regular(kind, tmp_path, monkeypatch):
    from harness.run.datasets import load_dataset

    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "cache" / "mnist1d-default.npz"
    words = not_regular(target, kind, tmp_path / "outside-fifo", monkeypatch)
    with deadline(), pytest.raises(OutputError) as info:
        load_dataset("mnist1d")
    assert str(target) in str(info.value) and words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", KINDS + ("device",))
def test_open_regular_refuses_before_reading(kind, tmp_path, monkeypatch):
    path = Path("/dev/null") if kind == "device" else tmp_path / "f"
    words = "a character device" if kind == "device" else not_regular(path, kind, tmp_path / "o", monkeypatch)
    for flags in (os.O_RDONLY, os.O_RDWR | os.O_CREAT | os.O_APPEND):
        with deadline(), pytest.raises(files.NotRegularFile, match=words):
            files.open_regular(path, flags)
    (tmp_path / "plain").write_bytes(b"ok")
    assert files.read_regular(tmp_path / "plain") == b"ok"
    link(tmp_path / "to-plain", tmp_path / "plain")
    assert files.read_regular(tmp_path / "to-plain", follow=True) == b"ok"
    with pytest.raises(files.NotRegularFile, match="a symbolic link"):
        files.read_regular(tmp_path / "to-plain")


# ------------------------------------------------------------------ a sweep that stops early leaves no empty folders

def _fail_check_links(monkeypatch):
    def refuse(root, rel="."):
        raise OutputError(f"{Path(root) / rel}: is a symbolic link (planted meanwhile)")
    monkeypatch.setattr("harness.execution.sweep.check_links", refuse)


def _fail_probe(monkeypatch):
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".write-probe"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", full)


@pytest.mark.parametrize("fail, words", [(_fail_check_links, "symbolic link"), (_fail_probe, "No space left")])
def test_a_results_folder_that_fails_its_check_leaves_no_folder_made_for_it(fail, words, tmp_path, no_runs, cli,
                                                                           monkeypatch):
    proto = tiny_protocol(tmp_path)
    results = tmp_path / "new" / "results"
    fail(monkeypatch)
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", "--no-mlflow", *QUIET)
    assert one_line_error(code, err, words), err
    assert not no_runs and not (tmp_path / "new").exists()  # before: new/results/tiny stayed behind


def _interrupt_in(name: str, how: str):
    def interrupt(*args, **kwargs):
        if how == "signal":  # a real Ctrl-C, through the sweep's own handler
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        from harness.config.errors import DriverInterrupt
        raise DriverInterrupt
    return f"harness.execution.sweep.{name}", interrupt


@pytest.mark.parametrize("where", ["check_writable", "_prepare_pretrained", "_progress_bar"])
@pytest.mark.parametrize("how", ["raise", "signal"])
def test_an_interrupt_before_the_first_record_leaves_no_empty_folders(where, how, tmp_path, no_runs, cli,
                                                                      monkeypatch):
    proto = tiny_protocol(tmp_path)
    results = tmp_path / "new" / "results"
    if where == "check_writable":  # after it made the folders
        from harness.execution import sweep

        real = sweep.check_writable
        name, interrupt = _interrupt_in(where, how)
        monkeypatch.setattr(name, lambda *a: real(*a) and interrupt())
    else:
        monkeypatch.setattr(*_interrupt_in(where, how))
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", "--no-mlflow", *QUIET)
    assert "interrupted (" in out + err, (out, err)
    assert not no_runs and not (tmp_path / "new").exists()  # before: new/results/tiny stayed behind


def test_an_interrupted_sweep_keeps_its_records_and_their_folders(tmp_path, cli, monkeypatch):
    proto = tiny_protocol(tmp_path, regimes=("head",), methods=("naive", "lwf"))
    results = tmp_path / "res"
    from harness.execution import sweep

    real, seen = sweep._write, []

    def write_then_stop(*args):
        seen.append(real(*args))
        from harness.config.errors import DriverInterrupt
        raise DriverInterrupt
    monkeypatch.setattr(sweep, "_write", write_then_stop)
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", "--no-mlflow", *QUIET)
    assert "interrupted (" in out + err and [p.parent for p in seen] == [results / "tiny" / "runs"]
    assert seen[0].is_file() and not (results / "tiny" / ".lock").exists()


@pytest.mark.parametrize("out", ["@/site", "@/a/b/site", f"{PROTO}/my-site"])
def test_a_leaderboard_checks_its_out_once(out, results, tmp_path, cli, monkeypatch):
    from harness.service import records

    real, calls = records.refuse_record_area, []
    monkeypatch.setattr(records, "refuse_record_area", lambda *a, **k: calls.append(a) or real(*a, **k))
    out = tmp_path / out[2:] if out.startswith("@/") else results / out
    code, _, err = cli("leaderboard", "--results", results, "--protocol", PROTO, "--out", out)
    assert code == 0, err
    assert len(calls) == 1, calls  # before: twice (leaderboard and build_leaderboard)
    code, _, err = cli("leaderboard", "--results", results, "--out", results / PROTO / "runs")
    assert one_line_error(code, err, "--out") and len(calls) == 2, err


# ------------------------------------------------------------------ MLflow's artifact tree: no link anywhere below

@pytest.mark.parametrize("below, kind", [("1", "folder"), ("1/abc/artifacts", "folder"),
                                         ("1/abc/artifacts/record.json", "file"), ("0/meta.yaml", "file"),
                                         ("1/dangling", "missing")])
def test_run_refuses_a_link_anywhere_below_mlartifacts(below, kind, tmp_path, outside, no_runs, cli):
    proto = tiny_protocol(tmp_path)
    results = tmp_path / "res"
    (results / "mlartifacts" / "1" / "abc" / "artifacts").mkdir(parents=True)
    (results / "mlartifacts" / "0").mkdir()
    target = {"file": outside[0], "folder": outside[1], "missing": tmp_path / "nowhere"}[kind]
    link(results / "mlartifacts" / below, target)
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-leaderboard", *QUIET)
    assert one_line_error(code, err, "symbolic link", str(results / "mlartifacts" / below)), err
    assert not no_runs and untouched(outside) and not (results / "tiny").exists()
