"""Records and stores are read as untrusted; every view is deterministic (issue 30).

- A view's choices are total: versions that number alike ("1", "01") are ordered by their text,
  never by a set's order, so no output changes with PYTHONHASHSEED.
- Every number a run measures besides its metrics (update norms, parameter counts, budget,
  timings, learning checks) is range-checked on read, and every spec field type-checked: a
  record failing either is one note naming the file and the field, and is never shown.
- A forged spec (a float seed and a recomputed run id) never displaces the real record.
- A tracking server that does not answer, at first contact or later, costs a few seconds and one
  warning, not minutes.
- `leaderboard --from-mlflow` refuses a store that does not exist, creating nothing.
"""
from __future__ import annotations

import copy
import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, make_spec
from hypothesis import given, settings, strategies as st

from harness.config.metrics import all_metrics, step_forgetting
from harness.config.specs import SCHEMA_VERSION, run_id_of
from harness.config.vocabulary import Scenario
from harness.execution.store import load_records
from harness.execution.views import version_key, view_records
from harness.run.checks import run_warnings

from .conftest import tiny_protocol

T = 5


def record_json(status: str = "ok", **spec) -> dict:
    """A valid record's JSON form (5-task digits spec of tests/conftest.py; override any spec field)."""
    spec = make_spec(**spec).to_dict()
    ok = status == "ok"
    R = [[round(0.95 - 0.05 * (i - j), 3) if j <= i else 0.5 for j in range(T)] for i in range(T)] if ok else []
    b = [0.5] * T if ok else []
    checks = {"chance": 0.5, "n_test": [100] * T, "probe_acc": [0.96] * T, "trained_acc": [None] * T,
              "loss_first": [0.7] * T, "loss_last": [0.2] * T}
    norms = {"shared": [None, 1.0, 1.5, 2.0, 2.5], "relative": [None, 0.1, 0.15, 0.2, 0.25],
             "per_block": {"fc1": [None, 0.5, 0.5, 0.5, 0.5]}, "drift": 3.0}
    if ok:
        norms["step_forgetting"] = step_forgetting(np.asarray(R))
    return {"schema_version": SCHEMA_VERSION, "run_id": run_id_of(spec), "status": status, "spec": spec,
            "error": None if ok else "diverged: loss became nan", "acc_matrix": R, "init_acc": b,
            "metrics": all_metrics(R, b) if ok else {}, "update_norms": norms,
            "diagnostics": {}, "params": {"trainable": 1010, "total": 38610, "fraction": 0.026, "adapters": 0},
            "regime_depth": 1, "n_blocks": 4,
            "timings": {"total_s": 1.5, "train_s": 1.0, "eval_s": 0.4, "per_task_s": [0.2] * T},
            "provenance": {"device": "cpu"}, "budget": {"optimizer_steps": 100, "samples_seen": 3200,
                                                         "steps_per_task": [20] * T, "samples_per_task": [640] * T,
                                                         "epochs_per_stage": [[2] for _ in range(T)]},
            "checks": checks if ok else {}, "warnings": run_warnings(R, checks, Scenario.TASK_IL) if ok else [],
            "acc_matrix_task_aware": None, "init_acc_task_aware": None, "metrics_task_aware": None}


def write(results: Path, data: dict) -> Path:
    """The record file of `data` under results/<protocol>/runs/ (named by its run id)."""
    runs = results / data["spec"]["protocol"] / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{data['run_id']}.json"
    path.write_text(json.dumps(data, allow_nan=True))
    return path


def put(doc: dict, path: str, value) -> dict:
    """A deep copy of `doc` with the value at a dotted path (`a.b[2]`) replaced."""
    doc = copy.deepcopy(doc)
    keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    parent = doc
    for k in keys[:-1]:
        parent = parent[k]
    parent[keys[-1]] = value
    return doc


def notes(results: Path) -> tuple[list, list[str]]:
    """(run ids of the records counted, the notes said while reading them)."""
    lines = []
    return [r.run_id for r in load_records(results, log=lines.append)], lines


def test_the_hand_made_record_is_valid(tmp_path):
    for status in ("ok", "diverged"):
        path = write(tmp_path / status, record_json(status))
        assert notes(tmp_path / status) == ([path.stem], [])


# --- 1. Views that depend on hash order -------------------------------------------------------

TIES = [("1", "01"), ("1.0", "1-0"), ("2.0", "2.00", "02.0"), ("1.a", "1-a"), ("3", "03", "003")]
PART = st.one_of(st.integers(0, 12), st.sampled_from(["a", "rc1", ""]))


@st.composite
def spellings(draw, parts):
    """One way to write version parts: numbers with 0-2 leading zeros, joined by '.' or '-'."""
    text = ""
    for i, p in enumerate(parts):
        text += ("" if i == 0 else draw(st.sampled_from(".-"))) + (
            "0" * draw(st.integers(0, 2)) + str(p) if isinstance(p, int) else p)
    return text


@settings(deadline=None, database=None, derandomize=True, max_examples=300)
@given(data=st.data(), parts=st.lists(PART, min_size=1, max_size=4))
def test_version_order_is_total(data, parts):
    """Two spellings of one version never compare equal: sorted() never falls back on the input order."""
    a, b = data.draw(spellings(parts)), data.draw(spellings(parts))
    if a != b:
        assert version_key(a) != version_key(b)
        assert sorted([a, b], key=version_key) == sorted([b, a], key=version_key)


@pytest.mark.parametrize("versions", TIES, ids="/".join)
def test_versions_that_number_alike_pick_one_and_say_so(versions, tmp_path):
    for i, v in enumerate(versions):
        write(tmp_path, record_json(protocol_version=v, label=f"m{i}"))
    for order in (1, -1):
        lines = []
        shown = view_records(load_records(tmp_path)[::order], log=lines.append)
        assert {r.spec.protocol_version for r in shown} == {max(versions, key=version_key)}
        assert sum("number alike" in line for line in lines) == 1, lines


CHILD = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from harness.service.records import build_leaderboard, export, print_summary
    from harness.service.requests import ExportRequest
    for folder in sorted(Path(sys.argv[1]).iterdir()):
        out = Path(sys.argv[2]) / f"{folder.name}.csv"
        export(ExportRequest(results=str(folder), out=str(out)), log=print)
        print(out.read_text())
        print_summary(folder, "test")
    site = Path(sys.argv[2]) / "site"  # one site (a build takes a while): its pages, byte for byte
    build_leaderboard(Path(sys.argv[1]) / "v0", "test", str(site))
    for page in sorted(site.rglob("*")):
        print(page.relative_to(site), page.read_bytes() if page.is_file() else "")
    """)


def test_views_are_the_same_under_every_hash_seed(tmp_path):
    """The export table and the summary of folders with tied versions, under four PYTHONHASHSEEDs."""
    for n, versions in enumerate(TIES):
        for i, v in enumerate(versions):
            write(tmp_path / "in" / f"v{n}", record_json(protocol_version=v, label=f"m{i}", seed=i))
    outputs = set()
    for seed in ("0", "1", "2", "3"):
        out = tmp_path / f"out{seed}"
        out.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", CHILD, tmp_path / "in", out], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout.replace(str(out), "OUT"))
    assert len(outputs) == 1, "the views differ between hash seeds"


# --- 2. Numbers other than metrics are range-checked on read ----------------------------------

BAD_NUMBERS = [
    ("update_norms.shared[2]", -1.0), ("update_norms.shared[3]", math.nan), ("update_norms.relative[1]", math.inf),
    ("update_norms.per_block.fc1[4]", -0.5), ("update_norms.drift", math.nan), ("update_norms.drift", -3.0),
    ("params.trainable", -3), ("params.total", 2.5), ("params.adapters", True), ("params.fraction", -0.1),
    ("params.fraction", math.inf),
    ("budget.optimizer_steps", -1), ("budget.samples_seen", 1.5), ("budget.samples_seen", math.nan),
    ("budget.steps_per_task[0]", -2), ("budget.epochs_per_stage[1][0]", 0.5),
    ("timings.total_s", -1.0), ("timings.train_s", math.inf), ("timings.eval_s", math.nan),
    ("timings.per_task_s[0]", -0.1), ("timings.total_s", "1.5"),
    ("n_blocks", -1), ("regime_depth", -2),
    ("checks.chance", 0.0), ("checks.chance", 2.0), ("checks.n_test[0]", -5), ("checks.probe_acc[1]", 1.5),
    ("checks.loss_last[2]", math.inf),
]


@pytest.mark.parametrize("field,value", BAD_NUMBERS, ids=[f"{f}={v!r}" for f, v in BAD_NUMBERS])
def test_out_of_range_numbers_are_refused_naming_file_and_field(field, value, tmp_path):
    path = write(tmp_path, put(record_json(), field, value))
    counted, lines = notes(tmp_path)
    assert counted == [], f"a record with {field} = {value!r} was counted"
    assert len(lines) == 1 and str(path) in lines[0] and field in lines[0], lines
    assert view_records(load_records(tmp_path), log=lambda _: None) == []


@pytest.mark.parametrize("field,value", [("update_norms.shared[2]", math.nan), ("update_norms.drift", math.inf)])
def test_a_diverged_run_may_record_non_finite_norms_never_negative_ones(field, value, tmp_path):
    good = write(tmp_path / "a", put(record_json("diverged"), field, value))
    assert notes(tmp_path / "a") == ([good.stem], [])
    write(tmp_path / "b", put(record_json("diverged"), field, -1.0))
    counted, lines = notes(tmp_path / "b")
    assert counted == [] and len(lines) == 1 and field in lines[0]


# --- 3. Forged specs: strict types on read, never displacing the real record ------------------

FORGED = [("seed", 0.0), ("seed", False), ("seed", "0"), ("seed", -1), ("order", 0.0), ("dataset.n_tasks", 5.0),
          ("dataset.classes_per_task", True), ("training.epochs", 2.0), ("training.batch_size", 32.0),
          ("training.lr", "0.05"), ("training.momentum", 1.5), ("eval_batch_size", 512.0),
          ("class_order[0]", 0.0), ("protocol_version", 1), ("label", None), ("hparams", {"x": math.nan}),
          ("scenario", "domain-il")]


@pytest.mark.parametrize("field,value", FORGED, ids=[f"{f}={v!r}" for f, v in FORGED])
def test_a_forged_spec_is_refused_and_the_real_record_stays(field, value, tmp_path, cli):
    real = record_json()
    forged = put(real, f"spec.{field}", value)
    forged["run_id"] = run_id_of(forged["spec"])  # recomputed: the forger knows the hash
    assert forged["run_id"] != real["run_id"]
    write(tmp_path, real)
    fake = write(tmp_path, forged)
    counted, lines = notes(tmp_path)
    assert counted == [real["run_id"]]
    assert len(lines) == 1 and str(fake) in lines[0] and field.split("[")[0] in lines[0], lines
    code, out, err = cli("export", "--results", tmp_path, "--out", tmp_path / "t.csv")
    assert code == 0, err
    rows = (tmp_path / "t.csv").read_text().splitlines()[1:]
    assert [r.split(",")[0] for r in rows] == [real["run_id"]]


def test_mlflow_records_of_one_run_id_are_chosen_by_content_with_a_warning(tmp_path):
    """Two different child runs claim one run id: the same one is shown whichever was logged first."""
    from mlflow import MlflowClient

    from harness.outputs.export import records_from_mlflow
    from harness.outputs.tracking import KIND_TAG, RECORD_ARTIFACT

    a, b = record_json(), put(record_json(), "timings.total_s", 9.0)
    chosen, uri = set(), f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(tracking_uri=uri)
    for n, pair in enumerate(((a, b), (b, a))):  # one experiment per order of logging
        exp = client.create_experiment(f"exp{n}", artifact_location=(tmp_path / f"art{n}").as_uri())
        for data in pair:
            run = client.create_run(exp, tags={KIND_TAG: "run", "run_id": data["run_id"]})
            client.log_text(run.info.run_id, json.dumps(data), RECORD_ARTIFACT)
            client.set_terminated(run.info.run_id, end_time=1000)
        lines = []
        found = records_from_mlflow(uri, f"exp{n}", log=lines.append)
        assert [r.run_id for r in found] == [a["run_id"]]
        assert sum("several different records" in line for line in lines) == 1, lines
        chosen.add(found[0].timings["total_s"])
    assert len(chosen) == 1


# --- 4. An unreachable tracking server -----------------------------------------------------------

class Server:
    """A loopback port that never answers: `refused` (bound, not listening), `silent` (listening,
    never accepting), `reads` (accepts and reads, never writes)."""

    def __init__(self, kind: str):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held = []
        if kind != "refused":
            self.sock.listen(16)
        if kind == "reads":
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            while True:
                conn, _ = self.sock.accept()
                self.held.append(conn)
                conn.recv(65536)
        except OSError:
            return

    def close(self):
        for c in self.held:
            c.close()
        self.sock.close()


@pytest.fixture(params=["refused", "silent", "reads"])
def dead_server(request):
    server = Server(request.param)
    yield f"http://127.0.0.1:{server.port}"
    server.close()


def test_an_unanswering_tracking_server_costs_seconds_and_one_warning(dead_server, monkeypatch):
    from harness.config.specs import RunRecord
    from harness.outputs.tracking import SWEEP_KEY_TAG, SweepTracker

    monkeypatch.setattr("harness.outputs.tracking.PROBE_TIMEOUT_S", 0.5, raising=False)
    lines = []
    info = {"name": "sweep", "params": {}, "tags": {SWEEP_KEY_TAG: "k"}}
    tracker = SweepTracker(dead_server, "exp", info, log=lines.append)
    record = RunRecord.from_dict(record_json())
    worker = threading.Thread(target=lambda: (tracker.log_record(record), tracker.finish()), daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(15)
    assert not worker.is_alive(), "tracking still waits for the server after 15 s"
    assert time.monotonic() - start < 5
    assert len(lines) == 1 and "did not answer" in lines[0] and not tracker.enabled, lines


@pytest.mark.slow
def test_a_one_run_sweep_with_an_unanswering_server_finishes(tmp_path, cli, monkeypatch):
    server = Server("reads")
    monkeypatch.setattr("harness.outputs.tracking.PROBE_TIMEOUT_S", 0.5, raising=False)
    proto = tiny_protocol(tmp_path, regimes=("head",))
    start = time.monotonic()
    try:
        code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-leaderboard",
                             "--no-progress", "--jobs", "1", "--tracking-uri", f"http://127.0.0.1:{server.port}")
    finally:
        server.close()
    assert code == 0, err
    assert time.monotonic() - start < 60
    assert len(list((tmp_path / "res" / "tiny" / "runs").glob("*.json"))) == 1
    warnings = [ln for ln in err.splitlines() if "MLflow" in ln]
    assert len(warnings) == 1 and "did not answer" in warnings[0], err


# --- 5. --from-mlflow refuses a store that does not exist ---------------------------------------

def _store(kind: str, tmp: Path) -> tuple[str, Path]:
    """(the --from-mlflow value, the path it names) for each kind of store that is not there."""
    if kind == "missing-sqlite":
        return f"sqlite:///{tmp / 'none.db'}", tmp / "none.db"
    if kind == "missing-folder-sqlite":
        return f"sqlite:///{tmp / 'no' / 'where.db'}", tmp / "no"
    if kind == "folder-sqlite":
        (tmp / "dir").mkdir()
        return f"sqlite:///{tmp / 'dir'}", tmp / "dir"
    if kind == "text-sqlite":
        (tmp / "notes.db").write_text("not a database\n")
        return f"sqlite:///{tmp / 'notes.db'}", tmp / "notes.db"
    if kind == "foreign-sqlite":
        import sqlite3
        from contextlib import closing

        with closing(sqlite3.connect(tmp / "other.db")) as db:
            db.execute("CREATE TABLE t (x)")
            db.commit()
        return f"sqlite:///{tmp / 'other.db'}", tmp / "other.db"
    if kind == "missing-path":
        return str(tmp / "mlruns"), tmp / "mlruns"
    if kind == "missing-file-uri":
        return (tmp / "mlruns").as_uri(), tmp / "mlruns"
    if kind == "plain-folder":
        (tmp / "plain").mkdir()
        (tmp / "plain" / "keep.txt").write_text("mine")
        return str(tmp / "plain"), tmp / "plain"
    raise ValueError(kind)


def _snapshot(path: Path):
    if path.is_dir():
        return sorted((p.relative_to(path).as_posix(), p.read_bytes() if p.is_file() else None)
                      for p in path.rglob("*"))
    return path.read_bytes() if path.exists() else None


@pytest.mark.parametrize("kind", ["missing-sqlite", "missing-folder-sqlite", "folder-sqlite", "text-sqlite",
                                  "foreign-sqlite", "missing-path", "missing-file-uri", "plain-folder"])
def test_from_mlflow_refuses_a_store_that_is_not_there_and_creates_nothing(kind, tmp_path, cli):
    uri, path = _store(kind, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir()), _snapshot(path)
    code, out, err = cli("leaderboard", "--from-mlflow", uri, "--experiment", "exp",
                         "--results", tmp_path / "res", "--out", tmp_path / "site")
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in err, err
    assert (sorted(p.name for p in tmp_path.iterdir()), _snapshot(path)) == before  # nothing created or changed


# --- 6. A tracking server that stops answering after first contact --------------------------------

class HalfServer:
    """Answers the reachability probe (GET /), then stops answering MLflow's requests: `hangs` (reads,
    never writes), `stalls` (headers, then one byte of the body), `retry-after` (503, Retry-After: 3600)."""

    def __init__(self, kind: str):
        self.kind, self.held = kind, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.uri = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            while True:
                conn, _ = self.sock.accept()
                self.held.append(conn)
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()
        except OSError:
            return

    def _answer(self, conn):
        try:
            while request := conn.recv(65536):
                if request.startswith(b"GET / "):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                if self.kind == "stalls":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 999\r\n\r\n{")
                elif self.kind == "retry-after":
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3600\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            return

    def close(self):
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.mark.parametrize("kind", ["hangs", "stalls", "retry-after"])
def test_a_server_that_stops_answering_after_the_probe_costs_seconds_once(kind, monkeypatch):
    from harness.config.specs import RunRecord
    from harness.outputs import tracking

    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                 "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER"):  # cl-bench's bounds, not the caller's
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(tracking, "HTTP_TIMEOUT_S", 1, raising=False)  # 10 s in use; the rule, not the wait
    from mlflow import MlflowClient  # noqa: F401  (imported before the clock starts: seconds on a busy machine)

    server = HalfServer(kind)
    lines = []
    info = {"name": "sweep", "params": {}, "tags": {tracking.SWEEP_KEY_TAG: "k"}}
    tracker = tracking.SweepTracker(server.uri, "exp", info, log=lines.append)
    record = RunRecord.from_dict(record_json())
    worker = threading.Thread(target=lambda: (tracker.log_record(record), tracker.log_record(record),
                                              tracker.finish()), daemon=True)
    start = time.monotonic()
    try:
        worker.start()
        worker.join(20)
    finally:
        server.close()
    assert not worker.is_alive(), "tracking still waits for the server after 20 s"  # before: minutes a request
    assert time.monotonic() - start < 8  # two requests of 1 s, once
    assert len(lines) == 1 and "MLflow logging failed" in lines[0] and not tracker.enabled, lines


def test_mlflow_waits_are_bounded_unless_the_user_chose(monkeypatch):
    from harness.outputs import tracking

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # the user's own choice wins
    monkeypatch.setenv("MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER", "")
    monkeypatch.delenv("MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER")
    tracking.bound_mlflow_waits()
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
        MLFLOW_HTTP_REQUEST_TIMEOUT,
        MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER,
    )

    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == tracking.HTTP_TIMEOUT_S == 10
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 3
    assert MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER.get() is False


# --- 7. Another spelling of the real spec: the same cell, another run id ------------------------

def _respell(spec: dict, how: str) -> dict:
    spec = copy.deepcopy(spec)
    if how == "empty plugins":
        spec["plugins"] = {}
    elif how == "null plugins":
        spec["plugins"] = None
    elif how == "weight_decay 0 for 0.0":
        spec["training"]["weight_decay"] = 0
    elif how == "lr 1 for 1.0":
        spec["training"]["lr"] = 1
    elif how == "no method_version":
        del spec["method_version"]
    elif how == "extra dataset key":
        spec["dataset"]["note"] = ""
    return spec


RESPELLINGS = ("empty plugins", "null plugins", "weight_decay 0 for 0.0", "lr 1 for 1.0", "no method_version",
               "extra dataset key")


@pytest.mark.parametrize("how", RESPELLINGS)
def test_another_spelling_of_the_real_spec_never_hides_the_real_record(how, tmp_path, cli):
    from harness.config.specs import TrainingSpec

    real = record_json(training=TrainingSpec(lr=1.0, momentum=0.9, epochs=2, batch_size=32))
    forged = copy.deepcopy(real)
    forged["spec"] = _respell(real["spec"], how)
    forged["run_id"] = run_id_of(forged["spec"])  # recomputed: the forger knows the hash
    assert forged["run_id"] != real["run_id"]
    write(tmp_path, real)
    fake = write(tmp_path, forged)
    counted, lines = notes(tmp_path)
    assert counted == [real["run_id"]], lines  # before: both counted, one cell, and the view dropped both
    assert len(lines) == 1 and str(fake) in lines[0], lines
    code, out, err = cli("export", "--results", tmp_path, "--out", tmp_path / "t.csv")
    assert code == 0, err
    assert [r.split(",")[0] for r in (tmp_path / "t.csv").read_text().splitlines()[1:]] == [real["run_id"]]


def test_key_order_is_no_spelling(tmp_path):
    real = record_json()
    real["spec"] = dict(reversed(list(real["spec"].items())))
    real["spec"]["training"] = dict(reversed(list(real["spec"]["training"].items())))
    path = write(tmp_path, dict(reversed(list(real.items()))))
    assert notes(tmp_path) == ([path.stem], [])


# --- 8. Torch hub weights are checked against the hash prefix in their name ------------------------

def _resnet18_bytes() -> bytes:
    import io

    import torch
    import torchvision

    buffer = io.BytesIO()
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("content", ["other-resnet18-weights", "empty", "random-bytes"])
def test_torch_hub_weights_that_do_not_match_their_name_are_one_line(content, tmp_path, monkeypatch):
    import torch

    from harness.config.errors import PretrainError
    from harness.config.pretrain import parse_pretrain
    from harness.config.specs import DatasetSpec
    from harness.run.pretrain import pretrained_backbone, torchvision_weights_file

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    path = torchvision_weights_file("IMAGENET1K_V1")  # .../resnet18-f37072fd.pth: torch hub's name and hash prefix
    path.parent.mkdir(parents=True)
    data = {"other-resnet18-weights": _resnet18_bytes, "empty": lambda: b"",
            "random-bytes": lambda: np.random.default_rng(1).bytes(4096)}[content]()
    path.write_bytes(data)
    spec = make_spec(pretrain=parse_pretrain({"torchvision": "IMAGENET1K_V1"}, "p.yaml", Path(".")),
                     dataset=DatasetSpec("digits", 5, 2, "resnet18"))
    with pytest.raises(PretrainError) as info:  # before: the other weights were used as ImageNet's
        pretrained_backbone(spec, (1, 8, 8))
    text = str(info.value)
    assert "\n" not in text and str(path) in text and "f37072fd" in text and "not the file its name says" in text
    assert torch.hub.get_dir() == str(tmp_path / "torch" / "hub")
