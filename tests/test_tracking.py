"""MLflow tracking, export and the MLflow-built leaderboard, against records on disk."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.cli import main
from harness.execution.store import load_records

PROTOCOL = """\
name: track
version: "1"
description: tracking test grid (3 runs, one of them failing)
scenario: task-il
pretrain: first-task
datasets:
  - {name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}
regimes: [full]
methods: [naive, {name: lwf, hparams: {alpha: 1.0, temperature: 2.0}}, boom]
task_orders: {count: 1, seed: 0}
seeds: [0]
training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 32}
evaluation: {batch_size: 512}
"""
BOOM = '''"""A method whose build raises: its run is recorded as failed."""
NAME = "boom"
DEFAULTS = {}


def build(ctx):
    raise ValueError("boom: this method always fails")
'''


def _files(folder: Path) -> tuple[str, str]:
    (folder / "track.yaml").write_text(PROTOCOL)
    (folder / "boom.py").write_text(BOOM)
    return str(folder / "track.yaml"), str(folder / "boom.py")


def _run(results, *extra):
    proto, boom = _files(Path(results).parent)
    return main(["run", "--protocol", proto, "--method", boom, "--results", str(results),
                 "--executor", "inline", "--no-progress", "--no-leaderboard", *extra])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One inline sweep (2 ok + 1 failed) into the default store <results>/mlflow.db."""
    results = tmp_path_factory.mktemp("tracking") / "results"
    assert _run(results) == 0
    return results


def _client(results):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")


def _runs(results, kind="run"):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{results / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["track"], filter_string=f"tags.`cl_bench.kind` = '{kind}'",
                              output_format="list")


@pytest.mark.slow
def test_sweep_in_mlflow_equals_records(swept):
    records = {r.run_id: r.to_dict() for r in load_records(swept, "track")}
    children = _runs(swept)
    (parent,) = _runs(swept, "sweep")
    assert sorted(c.data.tags["run_id"] for c in children) == sorted(records)
    assert parent.data.params["grid.total"] == "3" and parent.data.params["protocol"] == "track"
    assert (swept / "mlartifacts").is_dir()
    for child in children:
        rec, tags = records[child.data.tags["run_id"]], child.data.tags
        spec = rec["spec"]
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert (tags["status"], tags["dataset"], tags["regime"], tags["method"]) == \
            (rec["status"], "digits", "full", spec["method"])
        assert child.data.params["training.lr"] == "0.05"
        assert child.data.params["class_order"] == json.dumps(spec["class_order"], separators=(",", ":"))
        assert {k: v for k, v in child.data.metrics.items() if k in rec["metrics"]} == rec["metrics"]
        artifact = Path(child.info.artifact_uri.removeprefix("file://")) / "record.json"
        assert json.loads(artifact.read_text()) == rec
        if rec["status"] == "ok":
            _check_step_metrics(_client(swept), child.info.run_id, rec)
            assert child.info.status == "FINISHED"
        else:
            assert child.info.status == "FAILED" and "boom" in tags["error"]


def _check_step_metrics(client, run_id: str, rec: dict) -> None:
    R = rec["acc_matrix"]
    seen = [m.value for m in sorted(client.get_metric_history(run_id, "acc_after_task"), key=lambda m: m.step)]
    assert seen == [sum(R[k][:k + 1]) / (k + 1) for k in range(len(R))]
    assert math.isclose(sum(seen) / len(seen), rec["metrics"]["aia"], rel_tol=1e-12)
    norms = {m.step: m.value for m in client.get_metric_history(run_id, "update_norm")}
    assert norms == {t: v for t, v in enumerate(rec["update_norms"]["shared"]) if v is not None}
    assert len(norms) == len(R) - 1 and all(v > 0 for v in norms.values())
    fc1 = {m.step: m.value for m in client.get_metric_history(run_id, "update_norm.fc1")}
    assert fc1 == {t: v for t, v in enumerate(rec["update_norms"]["per_block"]["fc1"]) if v is not None}


@pytest.mark.slow
def test_resume_adds_no_runs_and_backfills_missing(swept):
    before = {r.info.run_id for r in _runs(swept) + _runs(swept, "sweep")}
    assert _run(swept) == 0
    assert {r.info.run_id for r in _runs(swept) + _runs(swept, "sweep")} == before
    # A child lost from MLflow (logging cut short) is logged again from the record on disk.
    lost = _runs(swept)[0]
    _client(swept).delete_run(lost.info.run_id)
    assert _run(swept) == 0
    after = _runs(swept)
    assert len(after) == 3 and {r.data.tags["run_id"] for r in after} == \
        {r.run_id for r in load_records(swept, "track")}


@pytest.mark.slow
def test_leaderboard_from_mlflow_matches_disk(swept, tmp_path):
    from harness.outputs.export import records_from_mlflow

    uri = f"sqlite:///{swept / 'mlflow.db'}"
    got = sorted(records_from_mlflow(uri, "track"), key=lambda r: r.run_id)
    assert got == sorted(load_records(swept, "track"), key=lambda r: r.run_id)
    assert main(["leaderboard", "--from-mlflow", uri, "--experiment", "track", "--out", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file()
    assert main(["leaderboard", "--from-mlflow", uri, "--experiment", "nope"]) == 2


@pytest.mark.slow
def test_no_mlflow_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    assert _run(results, "--methods", "boom", "--no-mlflow") == 0
    assert len(load_records(results, "track")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boom.py", "results", "track.yaml"]
    assert sorted(p.name for p in results.iterdir()) == ["track"]


@pytest.mark.slow
def test_broken_store_warns_once_and_the_sweep_finishes(tmp_path, capsys):
    results = tmp_path / "results"
    (tmp_path / "a-file").write_text("not a folder")
    bad = f"sqlite:///{tmp_path / 'a-file' / 'x.db'}"
    assert _run(results, "--methods", "naive,boom", "--tracking-uri", bad) == 0
    assert len(load_records(results, "track")) == 2
    assert capsys.readouterr().err.count("MLflow logging failed") == 1


def test_record_metrics_by_hand():
    from conftest import record_from

    from harness.outputs.tracking import flatten_spec, record_metrics

    rec = record_from({"metrics": {"acc": 0.5, "fwt": None}, "acc_matrix": [[1.0, 0.5], [0.75, 0.25]],
                       "update_norms": {"shared": [None, 2.0], "per_block": {"fc1": [None, 1.5]}, "drift": 3.0},
                       "timings": {}, "params": {}})
    got = sorted(record_metrics(rec))
    assert got == sorted([("acc", 0.5, 0), ("acc_after_task", 1.0, 0), ("acc_after_task", 0.5, 1),
                          ("acc_task.0", 1.0, 0), ("acc_task.1", 0.5, 0), ("acc_task.0", 0.75, 1),
                          ("acc_task.1", 0.25, 1), ("update_norm", 2.0, 1), ("update_norm.fc1", 1.5, 1),
                          ("drift", 3.0, 0)])
    assert flatten_spec({"a": {"b": 1, "c": {}}, "d": [1, 2], "e": None}) == \
        {"a.b": "1", "a.c": "{}", "d": "[1,2]", "e": "None"}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_tidy_table(swept, tmp_path, fmt):
    import pandas as pd

    from harness.analysis.frame import records_to_frame

    out = tmp_path / f"t.{fmt}"
    assert main(["export", "--results", str(swept), "--format", fmt, "--out", str(out)]) == 0
    got = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
    want = records_to_frame(load_records(swept, "track"))
    assert sorted(got["run_id"]) == sorted(want["run_id"])
    got, want = (f.sort_values("run_id").reset_index(drop=True) for f in (got, want))
    pd.testing.assert_series_equal(got["acc"], want["acc"])
    assert list(got["status"]) == list(want["status"])
    assert main(["export", "--results", str(tmp_path / "empty"), "--format", fmt]) == 2


@pytest.mark.slow
def test_leaderboard_from_mlflow_shows_one_protocol_version(tmp_path, capsys):
    """Two versions logged into one experiment: the site shows one (before: lr 0.05 and 0.01 averaged)."""
    results = tmp_path / "results"
    proto, boom = _files(tmp_path)
    v2 = tmp_path / "v2.yaml"
    v2.write_text(PROTOCOL.replace('version: "1"', 'version: "2"').replace("lr: 0.05", "lr: 0.01"))
    uri = f"sqlite:///{results / 'mlflow.db'}"
    common = ["--method", boom, "--results", str(results), "--executor", "inline", "--no-progress",
              "--no-leaderboard", "--methods", "naive", "--tracking-uri", uri]
    assert main(["run", "--protocol", proto, *common]) == 0
    assert main(["run", "--protocol", str(v2), *common]) == 0
    capsys.readouterr()
    assert main(["leaderboard", "--from-mlflow", uri, "--experiment", "track", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "protocol track version 2: 1 records (version(s) 1 left out: 1 records" in out
    assert "version <b>2</b>" in (tmp_path / "s" / "index.html").read_text()
    assert main(["leaderboard", "--from-mlflow", uri, "--experiment", "track", "--protocol-version", "1",
                 "--out", str(tmp_path / "s1")]) == 0
    assert "version <b>1</b>" in (tmp_path / "s1" / "index.html").read_text()
