"""Every registered method passes the adapter contract; discovery; the examples; `cl-bench submit`."""
import contextlib
import json
import textwrap
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from harness.api.registry import ENTRY_POINT_GROUP, RegistryError, discover, get_registry
from harness.cli import main
from harness.config.files import file_sha256
from harness.config.protocol import load_protocol, select
from harness.execution.check import check_adapter, contract_runs, contract_spec
from harness.execution.plan import expand
from harness.execution.submission import with_method
from harness.run.engine import run_one

with contextlib.chdir(ROOT):  # submissions/ is found relative to the working directory
    REGISTRY = get_registry()


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Two shared cores: one torch thread per test process keeps tiny runs fast (run from the root)."""
    monkeypatch.chdir(ROOT)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- the contract, over the whole registry -----------------------------------------------------

@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_method_passes_the_contract(name):
    adapter = REGISTRY[name]
    findings, passed = check_adapter(adapter)
    assert not findings, "\n".join(f.format() for f in findings)
    assert len(passed) == 5 * len(contract_runs(adapter))  # 5 checks per regime it is checked under


def test_check_runs_a_method_with_its_check_hparams_and_says_so(capsys):
    """DualPrompt's official layers (ViT-B/16's blocks 0-4) do not exist on the check's vit-tiny: the check
    runs it with its CHECK_HPARAMS, prints them, and a run is not affected by them."""
    assert main(["check", "dualprompt"]) == 0
    out = capsys.readouterr().out
    assert "checked with CHECK_HPARAMS={'g_layers': [0], 'e_layers': [1, 2]}" in out
    assert "dualprompt: the adapter contract holds" in out
    assert REGISTRY["dualprompt"].defaults["e_layers"] == [2, 3, 4]


def test_registry_holds_builtins_and_the_example_submissions():
    assert {"naive", "lwf", "l2-anchor", "mas"} <= set(REGISTRY)
    assert REGISTRY["l2-anchor"].source == "submissions/l2_anchor.py"
    assert REGISTRY["mas"].family == "submission"


# ---- discovery ---------------------------------------------------------------------------------

GOOD = ("NAME = {name!r}\nDEFAULTS = {{'k': 1}}\n"
        "def build(ctx, k):\n    from avalanche.training.supervised import Naive\n"
        "    return Naive(**ctx.strategy_kwargs())\n")


@pytest.fixture
def subs(tmp_path, monkeypatch):
    """An empty submissions folder (and no entry points) for discovery tests."""
    folder = tmp_path / "subs"
    folder.mkdir()
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(folder))
    return folder


def test_submissions_folder_is_scanned_and_private_files_skipped(subs):
    (subs / "mine.py").write_text(GOOD.format(name="mine"))
    (subs / "_helper.py").write_text("raise RuntimeError('never imported')\n")
    registry = discover(include_entry_points=False)
    assert registry["mine"].source == str(subs / "mine.py") and registry["mine"].defaults == {"k": 1}


def test_same_file_from_submissions_and_method_flag_counts_once(subs):
    (subs / "mine.py").write_text(GOOD.format(name="mine"))
    registry = discover(extra_files=(str(subs / "mine.py"), str(subs / ".." / "subs" / "mine.py")),
                        include_entry_points=False)
    assert "mine" in registry


def test_collision_between_two_files_names_both(subs, tmp_path):
    (subs / "a.py").write_text(GOOD.format(name="dup"))
    other = tmp_path / "b.py"
    other.write_text(GOOD.format(name="dup"))
    with pytest.raises(RegistryError, match=r"b\.py: method name 'dup' is already defined by .*subs/a\.py"):
        discover(extra_files=(str(other),), include_entry_points=False)


@pytest.mark.parametrize("body, message", [
    ("import nope_not_installed\n", r"bad\.py: import failed: ModuleNotFoundError"),
    ("NAME = 'x'\nDEFAULTS = {}\n", r"bad\.py: missing build"),
    ("NAME = 3\nDEFAULTS = {}\ndef build(ctx):\n    pass\n", r"bad\.py: NAME must be a string.*got 3"),
    ("NAME = 'a,b'\nDEFAULTS = {}\ndef build(ctx):\n    pass\n", r"bad\.py: NAME must be .*'a,b'"),
    ("NAME = 'x'\nDEFAULTS = [1]\ndef build(ctx):\n    pass\n", r"bad\.py: DEFAULTS must be a dict.*list"),
    ("NAME = 'x'\nDEFAULTS = {'s': {1, 2}}\ndef build(ctx, s):\n    pass\n", r"bad\.py: DEFAULTS of 'x' must hold plain JSON"),
    ("NAME = 'x'\nDEFAULTS = {}\nbuild = 5\n", r"bad\.py: build must be a function.*int"),
    ("NAME = 'x'\nDEFAULTS = {'lam': 1.0}\ndef build(ctx):\n    pass\n",
     r"bad\.py: build\(ctx\) of 'x' cannot be called as build\(ctx, \*\*DEFAULTS\).*'lam'"),
    ("ADAPTERS = ('naive',)\n", r"bad\.py: ADAPTERS must be a tuple of harness\.api\.contract\.MethodAdapter"),
    ("NAME = 'x'\nDEFAULTS = {'k': 1}\nCHECK_HPARAMS = {'K': 2}\ndef build(ctx, k):\n    pass\n",
     r"bad\.py: CHECK_HPARAMS of 'x' names K, not in DEFAULTS; allowed: k"),
    ("NAME = 'x'\nDEFAULTS = {'k': 1}\nCHECK_HPARAMS = [('k', 2)]\ndef build(ctx, k):\n    pass\n",
     r"bad\.py: CHECK_HPARAMS of 'x' must be a dict .*list"),
])
def test_ill_formed_submission_fails_discovery_with_file_and_reason(subs, body, message):
    (subs / "bad.py").write_text(body)
    with pytest.raises(RegistryError, match=message):
        discover(include_entry_points=False)


def test_cli_reports_a_broken_submissions_folder_in_one_line(subs, capsys):
    (subs / "bad.py").write_text("NAME = 'x'\nDEFAULTS = {}\n")
    assert main(["list", "methods"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cl-bench: error: ") and "bad.py: missing build" in err and "\n" not in err


def _fake_entry_points(monkeypatch, tmp_path, modules: dict, values: dict):
    """Entry points of a fake installed distribution: module files on sys.path + EntryPoint objects."""
    for mod, body in modules.items():
        (tmp_path / f"{mod}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [EntryPoint(name=n, value=v, group=ENTRY_POINT_GROUP) for n, v in values.items()]

    def entry_points(group=None, **kw):
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)


def test_entry_point_methods_are_registered(subs, tmp_path, monkeypatch):
    _fake_entry_points(monkeypatch, tmp_path, {"clb_pkg_good": GOOD.format(name="from-pip")},
                       {"from-pip": "clb_pkg_good"})
    registry = discover()
    assert registry["from-pip"].source == "entry point from-pip (clb_pkg_good)"


def test_entry_point_may_name_an_adapter_object(subs, tmp_path, monkeypatch):
    body = ("from harness.api.contract import MethodAdapter\n"
            "def build(ctx):\n    pass\n"
            "ADAPTER = MethodAdapter('obj-method', {}, build, 'from an object')\n")
    _fake_entry_points(monkeypatch, tmp_path, {"clb_pkg_obj": body}, {"obj-method": "clb_pkg_obj:ADAPTER"})
    assert discover()["obj-method"].description == "from an object"


def test_an_entry_points_own_file_given_as_a_method_file_counts_once(subs, tmp_path, monkeypatch):
    _fake_entry_points(monkeypatch, tmp_path, {"clb_pkg_same": GOOD.format(name="same")}, {"same": "clb_pkg_same"})
    registry = discover(extra_files=(str(tmp_path / "clb_pkg_same.py"),))
    assert registry["same"].source == "entry point same (clb_pkg_same)"


def test_a_builtin_module_file_checks_as_its_registered_methods(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert "naive" in discover(extra_files=("harness/methods/baselines.py",), include_entry_points=False)


def test_entry_point_import_failure_names_the_entry_point(subs, tmp_path, monkeypatch):
    _fake_entry_points(monkeypatch, tmp_path, {"clb_pkg_broken": "raise ImportError('no torch-scatter')\n"},
                       {"broken": "clb_pkg_broken"})
    with pytest.raises(RegistryError, match=r"entry point broken \(clb_pkg_broken\): import failed: "
                                            r"ImportError: no torch-scatter"):
        discover()


def test_entry_point_colliding_with_a_builtin_fails(subs, tmp_path, monkeypatch):
    _fake_entry_points(monkeypatch, tmp_path, {"clb_pkg_lwf": GOOD.format(name="lwf")}, {"lwf": "clb_pkg_lwf"})
    with pytest.raises(RegistryError, match=r"entry point lwf .*'lwf' is already defined by "
                                            r"harness\.methods\.regularization"):
        discover()


# ---- the two examples do what they say ----------------------------------------------------------

def test_l2_anchor_penalty_matches_a_hand_computation():
    from harness.run.models import build_model
    from harness.run.regimes import apply_regime

    l2 = REGISTRY["l2-anchor"]
    plugin = l2.build.__globals__["L2AnchorPlugin"](strength=3.0)
    model = build_model("mlp", (1, 2, 2), 2, 2)
    apply_regime(model, "last-1")  # only fc4 (+ heads) trainable
    strategy = types.SimpleNamespace(model=model, loss=torch.tensor(0.5))
    plugin.after_training_exp(strategy)
    fc4_weight = next(p for n, p in model.blocks["fc4"].named_parameters() if n.endswith("weight"))
    fc1_bias = next(p for n, p in model.blocks["fc1"].named_parameters() if n.endswith("bias"))
    with torch.no_grad():
        fc4_weight.add_(0.1)   # trainable: counts
        fc1_bias.add_(1.0)     # frozen: a constant, left out
    plugin.before_backward(strategy)
    n = fc4_weight.numel()
    assert float(strategy.loss.detach()) == pytest.approx(0.5 + 0.5 * 3.0 * n * 0.01, rel=1e-5)
    plugin.after_training_exp(strategy)
    assert plugin.harness_diagnostics()["l2_anchor_mean_penalty"] == [0.0, pytest.approx(1.5 * n * 0.01, rel=1e-5)]


def test_derpp_example_adds_two_replay_passes_and_the_papers_loss():
    """submissions/derpp.py: two extra forward passes per step, each memory batch in its own, and the loss
    CE + alpha * MSE(logits) + beta * CE(labels) (every stored row drawn: the means do not depend on the draw)."""
    import torch.nn.functional as F

    from harness.run.models import build_model

    plugin = REGISTRY["derpp-plugin"].build.__globals__["DerppPlugin"](mem_size=4, alpha=0.3, beta=0.5, seed=0)
    model = build_model("mlp", (1, 2, 2), 2, 2)
    torch.manual_seed(0)
    x, y, t = torch.randn(3, 1, 2, 2), torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1])
    logits = torch.randn(3, 2)
    strategy = types.SimpleNamespace(model=model, loss=torch.tensor(0.5), train_mb_size=8,
                                     _criterion=torch.nn.CrossEntropyLoss(), mb_x=x, mb_y=y, mb_task_id=t,
                                     mb_output=logits)
    plugin.after_update(strategy)  # 3 rows offered to 4 slots: all kept, in order
    assert plugin.rows() == 3 and torch.equal(plugin.store[0][:3], x) and torch.equal(plugin.store[3][:3], logits)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    plugin.before_backward(strategy)
    assert len(calls) == 2  # + the strategy's own forward pass: three per step
    with torch.no_grad():
        out = model(x, t)
        expected = 0.5 + 0.3 * F.mse_loss(out, logits) + 0.5 * F.cross_entropy(out, y)
    assert float(strategy.loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    for _ in range(3):  # 9 more rows: a reservoir of 4 over 12 offered
        plugin.after_update(strategy)
    assert plugin.seen == 12 and plugin.rows() == 4
    assert all(any(torch.equal(row, r) for r in x) for row in plugin.store[0])


@pytest.mark.slow
def test_l2_anchor_strength_trades_drift_and_mas_reduces_it():
    """strength 0 is sequential fine-tuning exactly; the drift after task 2 falls as strength grows."""
    def run(method, hparams):
        record = run_one(contract_spec(method, hparams, "full", epochs=1), device="cpu")
        assert record.status == "ok", record.error
        return record.update_norms["shared"][1], record.acc_matrix

    naive = run("naive", {})
    assert run("l2-anchor", {"strength": 0.0}) == naive
    drifts = [run("l2-anchor", {"strength": s})[0] for s in (3.0, 10.0, 30.0)]
    assert naive[0] > drifts[0] > drifts[1] > drifts[2] > 0
    assert run("mas", {"lambda_reg": 100.0, "alpha": 0.5})[0] < naive[0]


def test_mas_wrapper_hands_its_hyperparameters_to_avalanche():
    from avalanche.training.plugins import MASPlugin

    from harness.api.contract import MethodContext
    from harness.config.pretrain import Pretrain
    from harness.run.models import build_model
    from harness.run.plugins import HarnessPlugin

    model = build_model("mlp", (1, 2, 2), 2, 2)
    ctx = MethodContext(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        criterion=torch.nn.CrossEntropyLoss(), train_mb_size=8, eval_mb_size=8,
                        train_epochs=1, device=torch.device("cpu"), plugins=(HarnessPlugin(),), n_tasks=2,
                        regime="full", pretrain=Pretrain("first-task"), scenario="task-il", seed=0)
    strategy = REGISTRY["mas"].build(ctx, lambda_reg=7.0, alpha=0.25)
    (mas,) = [p for p in strategy.plugins if isinstance(p, MASPlugin)]
    assert (mas._lambda, mas.alpha) == (7.0, 0.25)
    assert ctx.plugins[0] in strategy.plugins


# ---- cl-bench submit ------------------------------------------------------------------------------

def _submit(path, results, *extra):
    return main(["submit", str(path), "--protocol", "smoke", "--results", str(results), "--regimes", "head,full",
                 "--orders", "1", "--jobs", "1", "--no-mlflow", "--no-progress", "--no-baselines", *extra])


def _records(results):
    return [json.loads(p.read_text()) for p in sorted((Path(results) / "smoke" / "runs").glob("*.json"))]


@pytest.mark.slow
def test_submit_runs_the_grid_for_the_method_and_marks_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "empty"))  # the file below is the only l2-anchor
    path, results = tmp_path / "my_l2.py", tmp_path / "results"
    path.write_text((ROOT / "submissions" / "l2_anchor.py").read_text())
    assert _submit(path, results) == 0
    out = capsys.readouterr().out
    assert "the adapter contract holds" in out and "2 runs (2 of 'l2-anchor') finished" in out
    records = _records(results)
    assert [r["spec"]["method"] for r in records] == ["l2-anchor", "l2-anchor"]
    assert {r["spec"]["regime"] for r in records} == {"head", "full"}
    assert all(r["status"] == "ok" and r["spec"]["hparams"] == {"strength": 1.0} for r in records)
    expected = {"file": path.as_posix(), "sha256": file_sha256(path)}
    assert all(r["provenance"]["submission"] == expected for r in records)
    assert all(r["spec"]["method_version"] == "sha256:" + expected["sha256"][:16] for r in records)
    # the run ids are those of a plain `cl-bench run --method FILE` of the same entry
    registry = get_registry((str(path),))
    protocol = select(with_method(load_protocol("smoke", registry), registry["l2-anchor"]),
                      regimes=["head", "full"], orders=1)
    assert {r["run_id"] for r in records} == {s.run_id for s in expand(protocol)}
    pages = [p.read_text() for p in (results / "smoke" / "site").rglob("*.html")]
    assert any("Submitted method" in page and "my_l2.py" in page for page in pages)

    # resubmitting the same file is a no-op; once the file is edited its runs are redone
    assert _submit(path, results, "--dry-run") == 0
    assert "done: 2   to run: 0" in capsys.readouterr().out
    path.write_text(path.read_text() + "\n# v2: a comment is enough to change the hash\n")
    assert _submit(path, results, "--dry-run") == 0
    assert "done: 0   to run: 2" in capsys.readouterr().out


def test_submit_refuses_a_file_that_fails_the_check(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "nostrat.py"
    bad.write_text("NAME = 'nostrat2'\nDEFAULTS = {}\ndef build(ctx):\n    return None\n")
    assert _submit(bad, tmp_path / "results") == 2
    assert "not an Avalanche strategy" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_submit_redoes_the_files_unsubmitted_records_and_counts_no_missing_data(tmp_path, cli, monkeypatch):
    """A record of the very file made by `run --method FILE` (no submission provenance) is run again
    by `submit`; a dry run still leaves out the runs of a data set that is not there."""
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "empty"))  # the file below is the only l2-anchor
    path, results = tmp_path / "my_l2.py", tmp_path / "results"
    path.write_text((ROOT / "submissions" / "l2_anchor.py").read_text())
    protocol = tmp_path / "two.yaml"
    protocol.write_text(textwrap.dedent("""\
        name: two
        version: "1"
        datasets: [{name: digits, n_tasks: 2, classes_per_task: 2, model: mlp},
                   {name: mnist, n_tasks: 2, classes_per_task: 2}]
        regimes: [head]
        methods: [l2-anchor]
        task_orders: {count: 1, seed: 0}
        seeds: [0]
        training: {optimizer: sgd, lr: 0.05, epochs: 1, batch_size: 64}
        """))
    quiet = ("--results", results, "--no-mlflow", "--no-progress", "--jobs", "1")
    code, _, err = cli("run", "--protocol", protocol, "--method", path, "--datasets", "digits", "--no-leaderboard",
                       *quiet)
    assert code == 0, err
    code, out, err = cli("submit", path, "--protocol", protocol, "--data-dir", tmp_path / "no-data", "--dry-run",
                         *quiet)
    assert code == 0, err
    assert "= 2 runs" in out and "not planned: 1 runs of mnist" in out
    assert "done: 0   to run: 1" in out  # the digits run again; mnist's run cannot be planned
