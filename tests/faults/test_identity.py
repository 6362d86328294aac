"""A record is what it says it is: run identity over code and data, records verified on read,
one protocol version per view, reproduce commands that reproduce.

Each test is a case an adversary or a careless user found; each failed before the fix.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from harness.execution.store import load_records, scan_runs

from .conftest import tiny_protocol

QUIET = ("--no-progress", "--no-mlflow", "--no-leaderboard")
METHOD = '''
    """A method file whose penalty strength is {strength}."""
    from harness.api.contract import MethodAdapter

    def build(ctx):
        from avalanche.training.supervised import Naive
        return Naive(**ctx.strategy_kwargs())

    ADAPTERS = (MethodAdapter("mine", {{}}, build, "mine, strength {strength}"),)
    '''


def _grid_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("done:"))


@pytest.mark.slow
def test_an_edited_method_file_is_not_reused(tmp_path, cli):
    method = tmp_path / "mine.py"
    method.write_text(textwrap.dedent(METHOD.format(strength=1)))
    proto = tiny_protocol(tmp_path, methods=("mine",), regimes=("head",))
    args = ("--protocol", proto, "--results", tmp_path / "r", "--method", method, *QUIET)
    assert cli("run", *args)[0] == 0
    assert "done: 1   to run: 0" in _grid_line(cli("run", *args, "--dry-run")[1])
    method.write_text(textwrap.dedent(METHOD.format(strength=2)))  # before: "done: 1   to run: 0"
    assert "done: 0   to run: 1" in _grid_line(cli("run", *args, "--dry-run")[1])
    code, out, _ = cli("run", *args)
    assert code == 0
    records = load_records(tmp_path / "r", "tiny")
    assert len(records) == 2 and len({r.spec.method_version for r in records}) == 2
    assert all(r.spec.method_version.startswith("sha256:") for r in records)
    assert all(r.provenance["method"]["source"] == str(method.resolve()) for r in records)


def _npz(path: Path, shift: float = 0.0) -> None:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 12)
    x = rng.normal(size=(48, 6)).astype(np.float32) + y[:, None] + shift
    np.savez(path, x_train=x, y_train=y, x_test=x[::2], y_test=y[::2])


@pytest.mark.slow
def test_regenerated_npz_data_is_not_reused_and_relative_paths_follow_the_protocol(tmp_path, cli, monkeypatch):
    folder = tmp_path / "study"
    folder.mkdir()
    _npz(folder / "data.npz")
    proto = folder / "p.yaml"
    proto.write_text(textwrap.dedent("""\
        name: mydata
        version: "1"
        datasets: [{name: "npz:data.npz", n_tasks: 2, classes_per_task: 2, model: mlp}]
        regimes: [head]
        methods: [naive]
        training: {epochs: 1, batch_size: 16}
        """))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the relative path is the protocol file's, not the working folder's
    from harness.cli import main

    args = ["run", "--protocol", str(proto), "--results", str(tmp_path / "r"), *QUIET]
    assert main(args) == 0
    (record,) = load_records(tmp_path / "r", "mydata")
    assert record.spec.dataset.name == f"npz:{(folder / 'data.npz').resolve()}"
    assert main([*args, "--datasets", "npz:data.npz", "--dry-run"]) == 0  # the name as the protocol wrote it
    _npz(folder / "data.npz", shift=0.5)  # same path, other data: before, "done: 1   to run: 0"
    from harness.run import datasets
    datasets.load_dataset.cache_clear()
    datasets._FINGERPRINTS.clear()
    assert main(args) == 0
    records = load_records(tmp_path / "r", "mydata")
    assert len(records) == 2 and len({r.spec.data_fingerprint for r in records}) == 2


def test_a_built_in_implementation_version_enters_the_run_id():
    import dataclasses

    from harness.api.registry import get_registry
    from harness.config.protocol import parse_protocol
    from harness.execution.plan import expand

    raw = {"name": "p", "version": "1", "datasets": ["digits"], "regimes": ["head"], "methods": ["naive"]}
    registry = get_registry()
    assert registry["naive"].implementation == "v1"
    bumped = {**registry, "naive": dataclasses.replace(registry["naive"], implementation="v2")}
    fp = {"digits": "sha256:0"}
    a, b = (expand(parse_protocol(dict(raw), "p.yaml", r), fp)[0] for r in (registry, bumped))
    assert a.method_version == "v1" and b.method_version == "v2" and a.run_id != b.run_id


def test_the_engine_refuses_a_method_or_data_changed_since_planning(spec_factory):
    import dataclasses

    from harness.run.engine import run_one

    spec = spec_factory(regime="head")
    data = dataclasses.replace(spec, data_fingerprint="sha256:0000000000000000")
    record = run_one(data, device="cpu")
    assert record.status == "failed" and "the data of 'digits' changed since this run was planned" in record.error
    method = dataclasses.replace(spec, method_version="v0")
    record = run_one(method, device="cpu")
    assert record.status == "failed" and "planned with v0: the method changed since" in record.error


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished 2-run sweep of the tiny protocol (copy before damaging)."""
    from harness.cli import main

    folder = tmp_path_factory.mktemp("swept")
    proto = tiny_protocol(folder, regimes=("head", "full"))
    assert main(["run", "--protocol", str(proto), "--results", str(folder / "r"), *QUIET]) == 0
    return proto, folder / "r"


def _copy(swept, tmp_path) -> tuple[Path, Path]:
    proto, results = swept
    shutil.copytree(results, tmp_path / "r")
    return proto, tmp_path / "r"


@pytest.mark.slow
def test_a_record_of_another_protocol_is_foreign(swept, tmp_path, cli):
    proto, results = _copy(swept, tmp_path)
    other = tiny_protocol(tmp_path, name="other", regimes=("last-1",))
    assert cli("run", "--protocol", other, "--results", results, *QUIET)[0] == 0
    (stranger,) = (results / "other" / "runs").glob("*.json")
    shutil.copy(stranger, results / "tiny" / "runs" / stranger.name)  # before: counted in tiny's tables
    scan = scan_runs(results / "tiny" / "runs")
    assert len(scan.valid) == 2 and [p.name for p, _ in scan.foreign] == [stranger.name]
    assert "a record of protocol 'other' in the folder of protocol 'tiny'" in scan.foreign[0][1]
    code, out, err = cli("leaderboard", "--results", results, "--protocol", "tiny", "--out", tmp_path / "site")
    assert code == 0 and f"{stranger.name} is foreign" in out
    index = (tmp_path / "site" / "index.html").read_text()
    assert "other" not in index.split("<h1")[1].split("</h1>")[0]


@pytest.mark.slow
def test_edited_metrics_are_corrupt_and_the_run_is_redone(swept, tmp_path, cli):
    proto, results = _copy(swept, tmp_path)
    path = sorted((results / "tiny" / "runs").glob("*.json"))[0]
    data = json.loads(path.read_text())
    true_acc = data["metrics"]["acc"]
    data["metrics"]["acc"] = 0.999  # before: accepted and shown as 99.9
    path.write_text(json.dumps(data))
    (_, reason), = scan_runs(results / "tiny" / "runs").invalid
    assert "its metrics do not follow from its accuracy matrix (acc 0.999 recorded" in reason
    code, out, _ = cli("run", "--protocol", proto, "--results", results, *QUIET)
    assert code == 0 and "done: 1   to run: 1" in out
    assert json.loads(path.read_text())["metrics"]["acc"] == true_acc


@pytest.mark.slow
def test_records_of_an_older_schema_are_foreign_not_rekeyed(swept, tmp_path):
    _, results = _copy(swept, tmp_path)
    path = sorted((results / "tiny" / "runs").glob("*.json"))[0]
    data = json.loads(path.read_text())
    data["schema_version"] = 1
    for key in ("method_version", "data_fingerprint"):
        del data["spec"][key]
    path.write_text(json.dumps(data))
    scan = scan_runs(results / "tiny" / "runs")
    assert len(scan.valid) == 1 and "schema_version 1: written by another cl-bench" in scan.foreign[0][1]


@pytest.mark.slow
def test_each_view_shows_the_runs_protocol_version(swept, tmp_path, cli):
    proto, results = _copy(swept, tmp_path)
    v2 = tmp_path / "v2.yaml"
    v2.write_text(proto.read_text().replace('version: "1"', 'version: "2"').replace("lr: 0.05", "lr: 0.01"))
    code, out, _ = cli("run", "--protocol", v2, "--regimes", "head", "--results", results, *QUIET)
    assert code == 0 and "protocol tiny version 2: 1 records" in out
    code, out, _ = cli("run", "--protocol", proto, "--results", results, *QUIET)  # before: "version 2"
    assert code == 0 and "protocol tiny version 1: 2 records" in out
    code, out, _ = cli("leaderboard", "--results", results, "--protocol", "tiny", "--protocol-version", "1",
                           "--out", tmp_path / "site1")
    assert code == 0 and "protocol tiny version 1: 2 records" in out
    assert "version <b>1</b>" in (tmp_path / "site1" / "index.html").read_text()
    code, out, _ = cli("export", "--results", results, "--protocol", "tiny", "--out", tmp_path / "t.csv")
    assert code == 0 and "protocol tiny version 2: 1 records" in out  # the newest, and it says so
    code, _, err = cli("leaderboard", "--results", results, "--protocol-version", "7")
    assert code == 2 and "has no records of version '7'; allowed: 1, 2" in err


@pytest.mark.slow
def test_a_protocol_edited_without_a_version_bump_is_never_averaged(swept, tmp_path, cli):
    proto, results = _copy(swept, tmp_path)
    edited = tmp_path / "edited.yaml"
    edited.write_text(proto.read_text().replace("lr: 0.05", "lr: 0.01"))  # same name, same version
    code, out, _ = cli("run", "--protocol", edited, "--regimes", "head", "--results", results, *QUIET)
    assert code == 0 and "record vs grid: training.lr 0.05 vs 0.01" in out  # the head record: its setting named
    assert "are of cells outside this grid" in out  # the full record: not selected by --regimes head
    code, out, _ = cli("leaderboard", "--results", results, "--protocol", "tiny", "--out", tmp_path / "s")
    assert code == 0 and "1 cells hold several records with different settings under version 1" in out
    assert "left out rather than averaged" in out  # before: a warning, and both settings averaged
    rows = (tmp_path / "s" / "data" / "runs.csv").read_text().splitlines()[1:]
    assert len(rows) == 1 and ",full," in rows[0]


@pytest.mark.parametrize("value,message", [
    ('"50"', "methods[0].hparams.mem_size: '50' is not allowed; allowed: an integer (the default is 200)"),
    ("50.5", "methods[0].hparams.mem_size: 50.5 is not allowed; allowed: an integer"),
    ("true", "methods[0].hparams.mem_size: True is not allowed; allowed: an integer"),
])
def test_hyperparameters_have_their_defaults_types(tmp_path, cli, value, message):
    proto = tiny_protocol(tmp_path, methods=(f"{{name: replay, hparams: {{mem_size: {value}}}}}",))
    code, _, err = cli("run", "--protocol", proto, "--dry-run", "--results", tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err


def test_an_integer_for_a_float_hyperparameter_is_the_same_setting(tmp_path):
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol

    a = load_protocol(str(tiny_protocol(tmp_path, "a", methods=("{name: ewc-online, hparams: {ewc_lambda: 5}}",))),
                      get_registry())
    b = load_protocol(str(tiny_protocol(tmp_path, "b", methods=("{name: ewc-online, hparams: {ewc_lambda: 5.0}}",))),
                      get_registry())
    assert a.methods[0].hparams == b.methods[0].hparams and isinstance(a.methods[0].hparams["ewc_lambda"], float)
    bad = tiny_protocol(tmp_path, "c", methods=("{name: became, hparams: {alpha: [1]}}",))
    with pytest.raises(Exception, match=r"alpha: \[1\] is not allowed; allowed: a string or a number"):
        load_protocol(str(bad), get_registry())


@pytest.mark.slow
def test_reproduce_reruns_a_record_of_a_yaml_path_protocol_bitwise(swept, tmp_path, cli):
    _, results = _copy(swept, tmp_path)
    path = sorted((results / "tiny" / "runs").glob("*.json"))[0]
    code, out, err = cli("reproduce", path.stem, "--results", results, "--out", tmp_path / "again")
    assert code == 0, err
    assert "reproduced: bitwise equal" in out
    again = json.loads((tmp_path / "again" / "tiny" / "runs" / path.name).read_text())
    assert again["acc_matrix"] == json.loads(path.read_text())["acc_matrix"]


@pytest.mark.slow
def test_reproduce_of_a_method_file_record_and_of_a_changed_method_file(tmp_path, cli):
    method = tmp_path / "mine.py"
    method.write_text(textwrap.dedent(METHOD.format(strength=1)))
    proto = tiny_protocol(tmp_path, methods=("mine",), regimes=("head",))
    results = tmp_path / "my results; touch PWNED"
    assert cli("run", "--protocol", proto, "--results", results, "--method", method, *QUIET)[0] == 0
    (path,) = (results / "tiny" / "runs").glob("*.json")
    code, out, err = cli("reproduce", path.stem, "--results", results, "--method", method)
    assert code == 0 and "reproduced: bitwise equal" in out, err
    code, _, err = cli("reproduce", path.stem, "--results", results)  # the record's path is never imported
    assert code == 2 and "pass --method FILE" in err and repr(str(method.resolve())) in err
    method.write_text(textwrap.dedent(METHOD.format(strength=2)))
    code, _, err = cli("reproduce", path.stem, "--results", results, "--method", method)
    assert code == 2 and f"is not code record {path.stem} was made with (method 'mine' sha256:" in err


def test_the_site_shows_a_shell_quoted_reproduce_command(tmp_path, cli):
    from harness.execution.reproduce import reproduce_command

    cmd = reproduce_command("0123456789ab", "my results;touch PWN")
    assert cmd == "cl-bench reproduce 0123456789ab --results 'my results;touch PWN'"
    assert shlex.split(cmd)[-1] == "my results;touch PWN"  # pasted, it runs no second command


@pytest.mark.slow
def test_reproduce_reports_a_corrupt_or_missing_record(swept, tmp_path, cli):
    _, results = _copy(swept, tmp_path)
    path = sorted((results / "tiny" / "runs").glob("*.json"))[0]
    path.write_text(path.read_text()[:100])
    code, _, err = cli("reproduce", path.stem, "--results", results)
    assert code == 2 and "is corrupt (not valid JSON" in err
    code, _, err = cli("reproduce", "0" * 12, "--results", results)
    assert code == 2 and "no record 000000000000 under" in err


@pytest.mark.slow
@pytest.mark.timeout(60) if hasattr(pytest.mark, "timeout") else (lambda f: f)
def test_a_fifo_a_device_link_and_an_oversized_file_never_hang_or_count(swept, tmp_path, cli):
    _, results = _copy(swept, tmp_path)
    runs = results / "tiny" / "runs"
    os.mkfifo(runs / "aaaaaaaaaaaa.json")             # before: every command hung on it
    os.symlink("/dev/zero", runs / "bbbbbbbbbbbb.json")  # before: read until memory ran out
    big = runs / "cccccccccccc.json"
    with open(big, "wb") as fh:
        fh.truncate(17 * 2**20)                          # sparse: 17 MiB without writing them
    t0 = time.monotonic()
    scan = scan_runs(runs)
    assert time.monotonic() - t0 < 30  # a hang would not return at all
    reasons = {p.name: r for p, r in scan.invalid}
    assert "not a regular file" in reasons["aaaaaaaaaaaa.json"]
    assert "symbolic link" in reasons["bbbbbbbbbbbb.json"]
    assert "17 MiB; a record is at most 16 MiB" in reasons["cccccccccccc.json"]
    assert len(scan.valid) == 2


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path, cli):
    bomb = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        bomb.append(f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [" + ", ".join([f"*{prev}"] * 10) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("name: bomb\nversion: '1'\ndatasets: [digits]\nregimes: [head]\n"
                    "methods: [{name: naive, hparams: {x: *i}}]\n".replace("hparams: {x: *i}", "hparams: {}")
                    + "\n".join(f"# {b}" for b in []) + "\n")
    path.write_text("anchors:\n" + "\n".join("  " + b for b in bomb) + "\nname: bomb\nversion: '1'\n"
                    "datasets: [digits]\nregimes: [head]\nmethods: [naive]\n")
    assert len(path.read_bytes()) < 1500  # 10^9 strings once expanded
    t0 = time.monotonic()
    code, _, err = cli("run", "--protocol", path, "--dry-run", "--results", tmp_path)
    assert time.monotonic() - t0 < 30  # before: 7.4 GB and still running
    assert code == 2 and "its YAML aliases expand to more than 100,000 nodes" in err


@pytest.mark.slow
def test_submit_whose_every_run_failed_exits_non_zero_with_the_errors(tmp_path, cli, bad_method_files,
                                                                       monkeypatch):
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "none"))
    failing = tmp_path / "fails_in_training.py"
    failing.write_text(textwrap.dedent('''
        """Passes the contract check's tiny stream, fails on digits (3 tasks)."""
        from avalanche.core import SupervisedPlugin

        NAME = "fails-late"
        DEFAULTS = {}

        class Boom(SupervisedPlugin):
            def before_training_exp(self, strategy, **kw):
                if strategy.clock.train_exp_counter >= 2:
                    raise RuntimeError("task 3 is too much")

        def build(ctx):
            from avalanche.training.supervised import Naive
            return Naive(**ctx.strategy_kwargs(Boom()))
        '''))
    code, out, err = cli("submit", failing, "--protocol", "smoke", "--results", tmp_path / "r", "--orders", "1",
                             "--regimes", "full", *QUIET)
    assert code == 1, out + err  # before: "(4 failed)" and exit 0
    assert "no run of 'fails-late' finished ok; 1 distinct error(s):" in err
    assert "1 x RuntimeError: task 3 is too much" in err


def test_view_notes_escape_hostile_labels():
    from conftest import record_from

    from harness.execution.views import view_records

    def rec(run_id, lam):
        return record_from({"run_id": run_id, "spec": {"label": "evil\x1b[2J\u202e", "hparams": {"x": lam}}})

    notes = []
    view_records([rec("a", 1), rec("b", 2)], log=notes.append)
    assert notes and all("\x1b" not in n and "\u202e" not in n for n in notes)
    assert "evil\\x1b[2J\\u202e" in notes[-1]


def test_torchvision_data_is_fingerprinted_from_its_files(tmp_path, cli):
    """Two copies of 'mnist' that differ: two sets of run ids; a dry run without the files plans none."""
    from test_datasets import write_mnist_like

    from harness.api.registry import get_registry
    from harness.config.protocol import parse_protocol
    from harness.execution.plan import data_fingerprints, expand

    a, b = tmp_path / "a", tmp_path / "b"
    write_mnist_like(a, "MNIST")
    write_mnist_like(b, "MNIST")
    raw = (b / "MNIST" / "raw" / "t10k-images-idx3-ubyte")
    data = bytearray(raw.read_bytes())
    data[-1] ^= 0xFF  # one pixel of one test image
    raw.write_bytes(bytes(data))
    protocol = parse_protocol({"name": "tv", "version": "1", "datasets": ["mnist"], "regimes": ["head"],
                               "methods": ["naive"]}, str(tmp_path / "tv.yaml"), get_registry())
    ids = [{s.run_id for s in expand(protocol, data_fingerprints(protocol, str(root)))} for root in (a, b)]
    assert len(ids[0]) == 1 and ids[0] != ids[1]
    (tmp_path / "tv.yaml").write_text("name: tv\nversion: '1'\ndatasets: [mnist]\nregimes: [head]\nmethods: [naive]\n")
    code, out, _ = cli("run", "--protocol", tmp_path / "tv.yaml", "--dry-run", "--results", tmp_path / "r",
                           "--data-dir", tmp_path / "none")
    assert code == 0 and "to run: 0" in out and "not planned: 1 runs of mnist, whose files are not there" in out
