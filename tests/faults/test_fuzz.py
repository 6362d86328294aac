"""Fuzzing the front door: malformed protocols and argument lists never give a traceback.

Every generated case must end in exit code 0 (it happened to be valid) or exit code 2 with
exactly one line on stderr naming what is wrong. The oracle for protocols is the exit code
itself plus the line's shape; an exception escaping `main` fails the test with the example.
"""
from __future__ import annotations

import copy
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.cli import main

BASE = {
    "name": "fz", "version": "1", "description": "fuzz base", "scenario": "task-il",
    "pretrain": "first-task",
    "datasets": [{"name": "digits", "n_tasks": 5, "classes_per_task": 2, "model": "mlp"}],
    "regimes": ["head", "last-1", "full"],
    "methods": ["naive", {"name": "lwf", "label": "lwf-a", "hparams": {"alpha": 1.0}}],
    "task_orders": {"count": 2, "seed": 0}, "seeds": [0, 1],
    "training": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "epochs": 1, "batch_size": 32},
    "evaluation": {"batch_size": 512}, "resources": {"num_cpus": 1},
}
HUGE = st.sampled_from([10**30, -10**30, 2**63, 2**64 + 1, 10**9, -1, 0, 1e308, -1e-320])
SCALARS = (st.none() | st.booleans() | st.integers(-(10**6), 10**6) | HUGE
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["digits", "npz:/nonexistent.npz", "npz:/tmp", "npz:~nobody-xyz/a.npz",
                              "npz:" + "a" * 300, "last-0", "last-99", "head", "a" * 300, "é ü ∑ 😀",
                              "2020-01-01", "..", "../x", "task-il", "sgd", ""]))
GARBAGE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
TALLY = {"protocol": 0, "protocol_invalid": 0, "yaml_text": 0, "yaml_text_invalid": 0, "argv": 0,
         "argv_invalid": 0, "record": 0, "record_refused": 0}
FUZZ = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])


def _paths(node, prefix=()):
    """Every (path to a value) in a nested dict/list."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, prefix + (key,))


PATHS = [p for p in _paths(BASE) if p]


@st.composite
def mutated_protocols(draw):
    """BASE with 1-3 edits: a value replaced by garbage, a key deleted, or a key added."""
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            kind = draw(st.sampled_from(["replace", "delete", "add"]))
            if kind == "replace":
                parent[path[-1]] = draw(GARBAGE)
            elif kind == "delete":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=8))] = draw(GARBAGE)
            else:
                parent.append(draw(GARBAGE))
        except (KeyError, IndexError, TypeError, AttributeError):  # an earlier edit removed or replaced the path
            pass
    return doc


def _check(code, out, err, tally_key, must_name=None):
    TALLY[tally_key] += 1
    assert "Traceback" not in out + err
    assert code in (0, 2), (code, err)
    if code == 2:
        TALLY[tally_key + "_invalid"] += 1
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("cl-bench"), lines[0]
        if must_name:
            assert must_name in lines[0], lines[0]
    else:
        assert not err.strip(), err


@pytest.fixture
def invoke(tmp_path, capsys, monkeypatch):
    """main() in an empty folder; returns (code, out, err)."""
    from conftest import ROOT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "no-submissions"))
    assert (ROOT / "protocols" / "smoke.yaml").exists()  # names resolve to the repo's protocols

    def run(argv):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help and friends
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@settings(FUZZ, max_examples=400)
@given(doc=mutated_protocols())
def test_mutated_protocols_fail_in_one_line(doc, invoke, tmp_path):
    path = tmp_path / "fz.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False))
    code, out, err = invoke(["run", "--protocol", str(path), "--results", str(tmp_path / "r"), "--dry-run"])
    _check(code, out, err, "protocol", must_name=str(path))


@settings(FUZZ, max_examples=150)
@given(cut=st.integers(0, 10**6), insert=st.text(max_size=10), at=st.integers(0, 10**6))
def test_damaged_yaml_text_fails_in_one_line(cut, insert, at, invoke, tmp_path):
    text = yaml.safe_dump(BASE, sort_keys=False)
    text = text[: len(text) - cut % (len(text) // 2)]  # truncated anywhere in its second half
    text = text[: at % (len(text) + 1)] + insert + text[at % (len(text) + 1):]
    path = tmp_path / "fz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code, out, err = invoke(["run", "--protocol", str(path), "--results", str(tmp_path / "r"), "--dry-run"])
    _check(code, out, err, "yaml_text", must_name=str(path))


COMMANDS = ["run", "list", "leaderboard", "export", "reproduce", "frobnicate", "-h"]
FLAGS = ["--protocol", "--results", "--datasets", "--methods", "--regimes", "--orders", "--only", "--jobs",
         "--executor", "--data-dir", "--download", "--device", "--method", "--retry-failed",
         "--no-progress", "--no-leaderboard", "--ray-address", "--num-cpus", "--num-gpus", "--max-retries",
         "--experiment", "--no-mlflow", "--run-timeout", "--out", "--format", "--help", "--bogus", "-x",
         "--protocol-version", "--threads"]
VALUES = ["smoke", "depth-sweep-mini", "nope", "x.yaml", "protocols/smoke.yaml", ".", "/", "/dev/null",
          "0", "-1", "1", "2", "nan", "inf", "-inf", "1e400", "9" * 50, "9" * 5000, "a" * 300, "x/" * 2100,
          "naive,lwf", ",", "naive,,", "head,full", "ray", "inline", "process", "cpu", "cuda", "tpu",
          "csv", "parquet", "é", "--", "-", "methods", "protocols", "all", "abc123def456", "🙂"]
TOKENS = st.sampled_from(FLAGS + VALUES) | st.text(st.characters(blacklist_categories=("Cs",),
                                                                    blacklist_characters="\x00"), max_size=8)


@settings(FUZZ, max_examples=300)
@given(command=st.sampled_from(COMMANDS), rest=st.lists(TOKENS, max_size=7))
def test_argument_lists_fail_in_one_line(command, rest, invoke, tmp_path):
    # NUL cannot occur in a real argv. `run` always gets --dry-run first so nothing ever runs;
    # relative paths land in an empty tmp folder, so leaderboard/export find no records.
    argv = [command, "--dry-run", *rest] if command == "run" else [command, *rest]
    code, out, err = invoke(argv)
    _check(code, out, err, "argv")


@pytest.mark.slow
def test_the_unmutated_record_is_valid(real_record, tmp_path):
    from harness.execution.store import scan_runs

    runs = tmp_path / real_record["spec"]["protocol"] / "runs"
    runs.mkdir(parents=True)
    (runs / f"{real_record['run_id']}.json").write_text(json.dumps(real_record))
    assert list(scan_runs(runs).valid) == [real_record["run_id"]]


@pytest.fixture(scope="module")
def real_record(tmp_path_factory):
    """The JSON form of one real record (a 2-task digits run)."""
    import dataclasses

    from conftest import make_spec

    from harness.config.specs import DatasetSpec
    from harness.run.engine import run_one

    spec = dataclasses.replace(make_spec(regime="head"), dataset=DatasetSpec("digits", 2, 2, "mlp"),
                               class_order=tuple(range(10)))
    return run_one(spec, device="cpu").to_dict()


RECORD_PATHS = None


@pytest.mark.slow
@settings(FUZZ, max_examples=int(__import__("os").environ.get("FUZZ_RECORDS", 300)))
@given(data=st.data())
def test_mutated_records_are_refused_or_consistent_never_a_crash(data, real_record, tmp_path):
    """Damage 1-3 values of a real record anywhere: reading the folder never raises."""
    from harness.execution.store import scan_runs

    global RECORD_PATHS
    RECORD_PATHS = RECORD_PATHS or [p for p in _paths(real_record) if p]
    doc = copy.deepcopy(real_record)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(RECORD_PATHS))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = data.draw(GARBAGE)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path
    runs = tmp_path / real_record["spec"]["protocol"] / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    target = runs / f"{real_record['run_id']}.json"
    target.write_text(json.dumps(doc))
    scan = scan_runs(runs)  # must not raise, whatever the file holds
    TALLY["record"] += 1
    assert len(scan.valid) + len(scan.invalid) + len(scan.foreign) == 1
    for record in scan.valid.values():  # anything counted is consistent, and every reader takes it
        from harness.analysis.frame import records_to_frame
        from harness.outputs.tracking import record_metrics, record_tags

        assert record.spec.run_id == record.run_id
        assert len(records_to_frame([record])) == 1 and record_tags(record)["run_id"] == record.run_id
        record_metrics(record)
    if not scan.valid:
        TALLY["record_refused"] += 1
    target.unlink()


def test_fuzz_tally():
    """Runs last in this file (pytest keeps file order): the totals of the closing note."""
    if TALLY["protocol"] == 0:
        pytest.skip("the fuzz tests did not run in this process")
    invalid = TALLY["protocol_invalid"] + TALLY["yaml_text_invalid"] + TALLY["argv_invalid"] + TALLY["record_refused"]
    print(f"\nfuzz cases: {TALLY}; malformed and rejected in one line: {invalid}")
    assert invalid >= 500
