"""`cl-bench check`: good submissions pass; each kind of bad submission gets its own message, exit 2."""
import textwrap

import numpy as np
import pytest
import torch
from conftest import ROOT

from harness.cli import main
from harness.execution.check import CONTRACT_REGIMES, check, contract_spec, gaussian_blobs
from harness.run.engine import run_one


@pytest.fixture(autouse=True)
def one_thread():
    """Two shared cores: one torch thread per test process keeps tiny runs fast."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


NAIVE_HEADER = """
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive
NAME = {name!r}
DEFAULTS = {{}}
"""

# name -> (module body, check id, text that must appear in the message)
BAD = {
    "no_build": ("NAME = 'nobuild'\nDEFAULTS = {}\n", "load", "missing build"),
    "syntax_error": ("NAME = 'syntax'\nDEFAULTS = {}\ndef build(ctx:\n    pass\n", "load", ":3: syntax error"),
    "name_collision": (NAIVE_HEADER.format(name="naive") + "def build(ctx):\n    return Naive(**ctx.strategy_kwargs())\n",
                       "load", "'naive' is already defined by harness.methods.baselines"),
    "import_error": ("import not_a_real_package_xyz\nNAME = 'imp'\nDEFAULTS = {}\ndef build(ctx):\n    pass\n",
                     "load", "import failed: ModuleNotFoundError"),
    "build_raises": ("NAME = 'boom'\nDEFAULTS = {}\ndef build(ctx):\n    raise RuntimeError('kaboom')\n",
                     "build", "build() raised RuntimeError: kaboom at "),
    # a method's own error that reads like the engine's is the method's error, not a contract breach
    "engine_lookalike": ("NAME = 'mimic'\nDEFAULTS = {}\ndef build(ctx):\n"
                         "    raise RuntimeError('the strategy never called the harness plugins')\n",
                         "build", "build() raised RuntimeError: the strategy never called the harness plugins at "),
    "non_strategy": ("NAME = 'nostrat'\nDEFAULTS = {}\ndef build(ctx):\n    return ctx.model\n",
                     "strategy", "returned CLNet, not an Avalanche strategy"),
    "drops_plugins": (NAIVE_HEADER.format(name="sneaky") + textwrap.dedent("""
        def build(ctx):
            return Naive(model=ctx.model, optimizer=ctx.optimizer, criterion=ctx.criterion,
                         train_mb_size=ctx.train_mb_size, eval_mb_size=ctx.eval_mb_size)
        """), "plugins", "never called the harness plugins"),
    "unfreezes": (NAIVE_HEADER.format(name="thaw") + textwrap.dedent("""
        class Thaw(SupervisedPlugin):
            def before_training_exp(self, strategy, **kw):
                params = list(strategy.model.parameters())
                for p in params:
                    p.requires_grad_(True)
                strategy.optimizer.param_groups[0]["params"] = params
        def build(ctx):
            return Naive(**ctx.strategy_kwargs(Thaw()))
        """), "frozen", "frozen parameters/buffers changed under regime 'head'"),
    "bn_drift": (NAIVE_HEADER.format(name="bntrain") + textwrap.dedent("""
        class AllTrain(SupervisedPlugin):
            def before_training_iteration(self, strategy, **kw):
                for m in strategy.model.modules():
                    m.training = True
        def build(ctx):
            return Naive(**ctx.strategy_kwargs(AllTrain()))
        """), "frozen", "running_mean"),
    "nondeterministic": (NAIVE_HEADER.format(name="noisy") + textwrap.dedent("""
        import random
        import torch
        class Noise(SupervisedPlugin):
            def __init__(self):
                super().__init__()
                self.rng = random.Random()  # unseeded: differs from run to run
            def before_backward(self, strategy, **kw):
                strategy.loss = strategy.loss * (1.0 + 0.1 * self.rng.random())
        def build(ctx):
            return Naive(**ctx.strategy_kwargs(Noise()))
        """), "determinism", "two runs with seed 0 differ"),
    "never_steps": (NAIVE_HEADER.format(name="lazy") + textwrap.dedent("""
        def build(ctx):
            return Naive(**{**ctx.strategy_kwargs(), "optimizer": ctx.new_optimizer(lr=1e-30)})
        """), "trainable", "changed none of the trainable parameters"),
    "training_raises": (NAIVE_HEADER.format(name="crash") + textwrap.dedent("""
        class Crash(SupervisedPlugin):
            def after_training_iteration(self, strategy, **kw):
                raise ValueError("bad shape")
        def build(ctx):
            return Naive(**ctx.strategy_kwargs(Crash()))
        """), "training", "training raised ValueError: bad shape at "),
}


def _write(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return path


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_submission_gets_its_own_message_and_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    body, check_id, text = BAD[case]
    path = _write(tmp_path, case, body)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"✗ {check_id}" in err and text in err, err
    assert "    fix: " in err
    assert "adapter contract is broken" in err
    # every other check id stays silent: one problem, one message
    others = {c for _, c, _ in BAD.values()} - {check_id}
    assert not any(f"✗ {c}" in err for c in others), err


def test_bad_cases_have_distinct_messages():
    texts = [t for _, _, t in BAD.values()]
    assert len(set(texts)) == len(texts)


def test_build_failure_points_at_the_line_in_the_file(tmp_path):
    path = _write(tmp_path, "boom2", BAD["build_raises"][0])
    result = check(str(path))
    (finding,) = result.findings
    assert f"{path}:4 (in build)" in finding.problem
    assert "kaboom" in finding.detail  # the traceback's tail


@pytest.mark.parametrize("example", ["l2_anchor", "mas_wrapped", "derpp"])
def test_example_submissions_pass_the_contract(example, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", f"submissions/{example}.py"]) == 0
    out = capsys.readouterr().out
    for regime in CONTRACT_REGIMES:
        assert f"✓ [{regime}] frozen parameters and buffers bitwise unchanged" in out
        assert f"✓ [{regime}] same seed, same accuracy matrix" in out
    assert "the adapter contract holds" in out


def test_check_accepts_a_registered_name_and_rejects_unknown_ones(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["check", "naive"]) == 0
    assert main(["check", "no-such-method"]) == 2
    assert "no registered method of that name" in capsys.readouterr().err


def test_contract_stream_is_two_tasks_of_two_seeded_classes():
    a, b = gaussian_blobs(), gaussian_blobs()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert sorted(set(a["y_train"])) == [0, 1, 2, 3] and a["x_train"].shape[1:] == (1, 8, 8)
    spec = contract_spec("naive", {}, "head")
    assert (spec.dataset.n_tasks, spec.dataset.classes_per_task, spec.dataset.model) == (2, 2, "small-cnn")
    assert spec.dataset.name.startswith("npz:")


@pytest.mark.slow
def test_probe_sees_what_the_regime_freezes():
    """Independent of the contract's own bookkeeping: under `head`, task 2 moves heads only."""
    seen = {}

    def observer(event, t, strategy):
        state = {n: p.detach().clone() for n, p in strategy.model.named_parameters()}
        seen[(event, t)] = state

    record = run_one(contract_spec("naive", {}, "head"), device="cpu", observer=observer)
    assert record.status == "ok"
    before, after = seen[("before_task", 1)], seen[("after_task", 1)]
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all(n.startswith("heads.1.") for n in moved)


def test_every_contract_breach_has_a_fix_and_survives_pickling():
    import pickle

    from harness.execution.check import BREACH_FIXES
    from harness.run.engine import AdapterError, Breach

    assert set(BREACH_FIXES) == {b.value for b in Breach}
    again = pickle.loads(pickle.dumps(AdapterError("frozen: fc1.weight", Breach.FROZEN)))
    assert (str(again), again.breach) == ("frozen: fc1.weight", Breach.FROZEN)


def _declared(families, allowed=None, name="declared"):
    """An adapter stand-in with the declarations contract_runs reads (`regimes_allowed` is optional)."""
    from types import SimpleNamespace

    out = SimpleNamespace(name=name, defaults={}, regime_families=tuple(families), scenarios=("task-il", "class-il"))
    if allowed is not None:
        out.regimes_allowed = allowed
    return out


def test_a_refused_contract_regime_is_replaced_by_the_nearest_admitted_one():
    """head/full where admitted (every method admitting both: unchanged); else the first admitted candidate, on
    vit-tiny where it needs transformer blocks; a regime with no admitted candidate is skipped."""
    from harness.api.registry import get_registry
    from harness.execution.check import contract_runs
    from harness.methods.slca import refused_regime

    plain = (("head", "small-cnn"), ("full", "small-cnn"))
    for name, adapter in get_registry().items():
        if {"depth"} <= set(adapter.regime_families) and getattr(adapter, "regimes_allowed", None) is None:
            assert contract_runs(adapter) == plain, name
    assert contract_runs(_declared(("depth", "bitfit", "norm", "lora", "prompt", "prompt-deep"))) == plain
    assert contract_runs(get_registry()["l2p"]) == (("prompt-l4", "vit-tiny"),)
    assert contract_runs(_declared(("prompt-deep",))) == (("prompt-deep-l4", "vit-tiny"),)
    assert contract_runs(_declared(("depth", "lora"), refused_regime)) == (("last-1", "small-cnn"), plain[1])
    assert contract_runs(_declared(("depth",), lambda r: None if r == "head" else "head only")) == (plain[0],)
    assert contract_runs(_declared(("lora", "norm"))) == (("norm", "small-cnn"), ("lora-r2", "small-cnn"))
    assert contract_runs(_declared(("depth",), lambda r: "none")) == plain  # admits nothing: build() says why
    assert contract_runs(get_registry()["slca"]) == (("last-1", "small-cnn"), plain[1])

    def broken(regime):
        raise KeyError(regime)
    assert contract_runs(_declared(("depth",), broken)) == plain  # a raising declaration admits: the run shows more


@pytest.mark.slow
def test_l2p_and_slca_pass_the_contract_under_the_regimes_they_admit(capsys, monkeypatch):
    """l2p (prompt family only) on vit-tiny under prompt-l4; slca (depth and lora, not head: declared through
    regimes_allowed) under last-1 and full."""
    from harness.api.registry import get_registry
    from harness.execution.check import check_adapter

    monkeypatch.chdir(ROOT)
    assert main(["check", "l2p"]) == 0
    out = capsys.readouterr().out
    assert "✓ [prompt-l4 on vit-tiny] same seed, same accuracy matrix" in out and "[head]" not in out
    findings, passed = check_adapter(get_registry()["slca"])
    assert not findings, [f.format() for f in findings]
    assert any(p.startswith("✓ [last-1] trainable parameters changed") for p in passed)
    assert any(p.startswith("✓ [full] same seed") for p in passed)
