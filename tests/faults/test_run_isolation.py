"""A method cannot reach past its run: process state, test data, exits and interrupts, batches of one.

Each class gets several generated variants: method files that leak process state (each followed by a
naive run that must equal a clean one bitwise), that grade themselves, that exit or interrupt, and
training set-ups that leave a last batch of one row on a BatchNorm model.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import make_spec  # tests/conftest.py (tests/ is on the path)

from harness.config.specs import DatasetSpec, TrainingSpec
from harness.execution.executors import InlineExecutor, RunOptions
from harness.run.engine import run_one

from .conftest import REPO, tiny_protocol

pytestmark = pytest.mark.long  # make test-long: process lifecycle, minutes (Makefile)

TINY = dict(dataset=DatasetSpec("digits", 2, 2, "mlp"), regime="full", pretrain="none",
            training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=64))
IGNORED = {"timings", "provenance"}


def method_file(folder: Path, name: str, *, build: str = "", after_task: str = "") -> Path:
    """A Naive method whose build() runs `build` and whose plugin runs `after_task` after each task."""
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(textwrap.dedent("""\
        import inspect, os, random, signal, sys
        import numpy as np
        import torch
        from avalanche.core import SupervisedPlugin
        from avalanche.training import Naive

        NAME = {name!r}
        DEFAULTS = {{}}

        class Leak(SupervisedPlugin):
            def after_training_exp(self, strategy, **kwargs):
                ctx = strategy.harness_ctx
        {after_task}
                pass

        def build(ctx):
        {build}
            strategy = Naive(**ctx.strategy_kwargs(Leak()))
            strategy.harness_ctx = ctx
            return strategy
        """).format(name=name, build=textwrap.indent(textwrap.dedent(build), " " * 4),
                    after_task=textwrap.indent(textwrap.dedent(after_task), " " * 8)))
    return path


def measured(record) -> dict:
    """A record without what may differ between equal runs (timings, provenance)."""
    return {k: v for k, v in record.to_dict().items() if k not in IGNORED}


@pytest.fixture(scope="module")
def clean():
    """A naive run's record in an untouched process state."""
    return measured(run_one(make_spec(**TINY), device="cpu"))


def process_state() -> dict:
    """What a method's leak changes, as seen from outside."""
    return {"dtype": torch.get_default_dtype(), "device": torch.get_default_device(), "grad": torch.is_grad_enabled(),
            "threads": torch.get_num_threads(), "cwd": os.getcwd(), "env": dict(os.environ),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "anomaly": torch.is_anomaly_enabled(),
            "sys.path": list(sys.path), "sigterm": signal.getsignal(signal.SIGTERM),
            "code": [vars(torch.nn.ReLU).get("forward"), vars(torch.Tensor).get("argmax"),
                     torch.nn.functional.cross_entropy, vars(torch.optim.SGD).get("step"), torch.manual_seed,
                     np_seed(), vars(torch.nn.Linear).get("__call__")]}


def np_seed():
    import numpy as np

    return np.random.seed


# -- 1. process state: put back after every run ---------------------------------------------------------
LEAKS = {
    "dtype": "torch.set_default_dtype(torch.float64)",
    "default-device": "torch.set_default_device('meta')",
    "chdir": "os.chdir(os.path.dirname(__file__))",
    "relu-forward": "torch.nn.ReLU.forward = lambda self, x: x.clamp(min=0) * 3",
    "tensor-method": "torch.Tensor.argmax = lambda self, *a, **k: torch.zeros(len(self), dtype=torch.long)",
    "functional": "torch.nn.functional.cross_entropy = lambda x, y, *a, **k: (x * 0).sum()",
    "optimizer-step": "torch.optim.SGD.step = lambda self, closure=None: None",
    "added-call": "torch.nn.Linear.__call__ = lambda self, x: torch.nn.Module.__call__(self, x) * 0",
    "grad-off": "torch.set_grad_enabled(False)",
    "threads": "torch.set_num_threads(3)",
    "rng": ("torch.manual_seed = lambda *a, **k: None\nnp.random.seed = lambda *a, **k: None\n"
            "random.seed = lambda *a, **k: None\ntorch.rand(7)"),
    "env": "os.environ['CL_BENCH_LEAKED'] = '1'\nos.environ.pop('HOME', None)",
    "deterministic": "torch.use_deterministic_algorithms(True, warn_only=True)",
    "anomaly": "torch.set_anomaly_enabled(True)",
    "sys-path": "sys.path.insert(0, '/nonexistent-leak')",
    "signal": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",
}


@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_a_run_leaves_no_process_state_behind(leak, tmp_path, clean):
    path = method_file(tmp_path, f"leak-{leak}", after_task=LEAKS[leak])
    before = process_state()
    run_one(make_spec(**{**TINY, "method": f"leak-{leak}"}), device="cpu", method_files=(str(path),))
    assert process_state() == before
    assert measured(run_one(make_spec(**TINY), device="cpu")) == clean


@pytest.mark.parametrize("where", ["build", "after_task"])
def test_a_leak_in_build_or_in_training_is_put_back_too(where, tmp_path, clean):
    code = "torch.set_default_dtype(torch.float64)\ntorch.nn.ReLU.forward = lambda self, x: x"
    path = method_file(tmp_path, "leak-both", **{where: code})
    run_one(make_spec(**{**TINY, "method": "leak-both"}), device="cpu", method_files=(str(path),))
    assert measured(run_one(make_spec(**TINY), device="cpu")) == clean


HARNESS_PATCHES = {
    "evaluation": "import harness.run.evaluation as m\nm.task_accuracy = lambda *a, **k: 1.0",
    "metrics": "import harness.config.metrics as m\nm.all_metrics = lambda *a, **k: {'ACC': 1.0}",
    "engine": "import harness.run.engine as m\nm.evaluate_class_il = lambda *a, **k: ([1.0], [1.0])",
    # a wrapping proxy (as wrapt makes) that says it equals what it replaced: caught by identity
    "equal-proxy": "import harness.run.evaluation as m\n"
                   "class Proxy:\n"
                   "    def __init__(self, f): self.f = f\n"
                   "    def __call__(self, *a, **k): return 1.0\n"
                   "    def __eq__(self, other): return other is self.f or other is self\n"
                   "    __hash__ = object.__hash__\n"
                   "if not isinstance(m.task_accuracy, Proxy): m.task_accuracy = Proxy(m.task_accuracy)",
}


@pytest.mark.parametrize("patch", sorted(HARNESS_PATCHES))
def test_patching_the_harness_fails_the_run_and_is_put_back(patch, tmp_path, clean):
    path = method_file(tmp_path, f"patch-{patch}", build=HARNESS_PATCHES[patch])
    record = run_one(make_spec(**{**TINY, "method": f"patch-{patch}"}), device="cpu", method_files=(str(path),))
    assert record.status == "failed" and "changed the harness's own code" in record.error
    assert record.metrics == {}
    assert measured(run_one(make_spec(**TINY), device="cpu")) == clean


# What no setter can put back: the method keeps a guard or mode object alive (on torch, so the test can end it).
DIRTY = {
    "inference-mode": "torch.leak_keep = getattr(torch, 'leak_keep', [])\n"
                      "torch.leak_keep.append(torch.inference_mode())\ntorch.leak_keep[-1].__enter__()",
    "function-mode": "from torch.overrides import TorchFunctionMode\n"
                     "class Through(TorchFunctionMode):\n"
                     "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
                     "        return func(*args, **(kwargs or {}))\n"
                     "torch.leak_keep = getattr(torch, 'leak_keep', [])\n"
                     "torch.leak_keep.append(Through())\ntorch.leak_keep[-1].__enter__()",
}


@pytest.fixture
def dirty_files(tmp_path, monkeypatch):
    """{name: path} of methods that leave state no setter can put back; ends it (and the process's
    dirty mark) after the test."""
    from harness.run import isolation

    monkeypatch.setattr(isolation, "_DIRTY", [])
    yield {name: method_file(tmp_path, f"dirty-{name}", after_task=code) for name, code in DIRTY.items()}
    for guard in reversed(getattr(torch, "leak_keep", [])):
        guard.__exit__(None, None, None)
    torch.leak_keep = []


@pytest.mark.parametrize("dirty", sorted(DIRTY))
def test_state_that_cannot_be_put_back_fails_the_run_and_marks_the_process(dirty, dirty_files):
    from harness.run.isolation import process_dirty

    record = run_one(make_spec(**{**TINY, "method": f"dirty-{dirty}"}), device="cpu",
                     method_files=(str(dirty_files[dirty]),))
    assert record.status == "failed" and "cannot be put back" in record.error
    assert process_dirty()


def test_inline_hands_the_runs_after_a_dirty_one_to_a_worker_process(dirty_files, monkeypatch):
    from harness.execution.executors import process

    handed = []
    monkeypatch.setattr(process.ProcessExecutor, "run", lambda self, specs: handed.extend(specs) or iter(()))
    specs = [make_spec(**{**TINY, "method": "dirty-inference-mode"}), make_spec(**TINY),
             make_spec(**{**TINY, "seed": 1})]
    options = RunOptions(device="cpu", method_files=tuple(str(p) for p in dirty_files.values()))
    records = list(InlineExecutor(options).run(specs))
    assert len(records) == 1 and records[0].status == "failed"
    assert handed == specs[1:]


@pytest.mark.slow
def test_state_that_cannot_be_put_back_fails_the_run_and_the_next_runs_get_a_fresh_worker(dirty_files, clean):
    """Inline: the rest of the sweep moves to a worker process; there, a dirty worker is replaced."""
    files = tuple(str(p) for p in dirty_files.values())
    other_seed = measured(run_one(make_spec(**{**TINY, "seed": 1}), device="cpu"))
    specs = [make_spec(**{**TINY, "method": m}) for m in ("dirty-function-mode", "naive", "dirty-inference-mode")]
    specs.append(make_spec(**{**TINY, "seed": 1}))  # another run id; it fails in a worker left in inference mode
    records = list(InlineExecutor(RunOptions(device="cpu", method_files=files)).run(specs))
    assert [r.status for r in records] == ["failed", "ok", "failed", "ok"]
    assert "cannot be put back (torch function modes)" in records[0].error
    assert "cannot be put back (inference mode)" in records[2].error
    assert measured(records[1]) == clean
    assert measured(records[3]) == other_seed


# -- 2. test data: the method's copies, the harness's fingerprints -----------------------------------------
SELF_GRADING = {  # each would raise the run's accuracy or change what it is measured on
    "y-test-in-place": "for t in ctx.tasks:\n    t.y_test.zero_()",
    "x-test-in-place": "for t in ctx.tasks:\n    t.x_test.mul_(0)",
    "y-test-replaced": "for t in ctx.tasks:\n    object.__setattr__(t, 'y_test', torch.zeros_like(t.y_test))",
    "tasks-replaced": "object.__setattr__(ctx, 'tasks', ())",
}
REACHED_THROUGH = {  # past the copies, into the engine's own tensors (the fingerprints catch it)
    "frame-y-test": "tasks = next(f.frame.f_locals['tasks'] for f in inspect.stack() if 'fingerprints' in "
                    "f.frame.f_locals)\nfor t in tasks:\n    t.y_test.zero_()",
    "frame-x-test": "tasks = next(f.frame.f_locals['tasks'] for f in inspect.stack() if 'fingerprints' in "
                    "f.frame.f_locals)\ntasks[-1].x_test[:5] = 0",
}


@pytest.mark.parametrize("grading", sorted(SELF_GRADING))
def test_a_method_cannot_write_to_the_test_data_it_is_given(grading, tmp_path, clean):
    path = method_file(tmp_path, f"grade-{grading}", after_task=SELF_GRADING[grading])
    record = run_one(make_spec(**{**TINY, "method": f"grade-{grading}"}), device="cpu", method_files=(str(path),))
    assert record.status == "ok", record.error
    assert (record.acc_matrix, record.init_acc, record.metrics) == (clean["acc_matrix"], clean["init_acc"],
                                                                     clean["metrics"])


@pytest.mark.parametrize("grading", sorted(REACHED_THROUGH))
def test_test_data_changed_behind_the_copies_fails_the_run(grading, tmp_path, clean):
    path = method_file(tmp_path, f"reach-{grading}", after_task=REACHED_THROUGH[grading])
    record = run_one(make_spec(**{**TINY, "method": f"reach-{grading}"}), device="cpu", method_files=(str(path),))
    assert record.status == "failed"
    assert "the test data of task" in record.error and "changed during task 1" in record.error
    assert measured(run_one(make_spec(**TINY), device="cpu")) == clean  # the data set cache was not reached


ENGINE_TASKS = "tasks = next(f.frame.f_locals['tasks'] for f in inspect.stack() if 'host_tasks' in f.frame.f_locals)\n"
IN_BUILD = {  # the same, from build(): before the first task, before the first evaluation
    "y-test": ENGINE_TASKS + "for t in tasks:\n    t.y_test.zero_()",
    "x-test": ENGINE_TASKS + "tasks[-1].x_test[:5] = 0",
    "one-label": ENGINE_TASKS + "tasks[0].y_test[0] = 1 - tasks[0].y_test[0]",
}


@pytest.mark.parametrize("grading", sorted(IN_BUILD))
def test_test_data_changed_in_build_fails_the_run(grading, tmp_path):
    path = method_file(tmp_path, f"build-{grading}", build=IN_BUILD[grading])
    record = run_one(make_spec(**{**TINY, "method": f"build-{grading}"}), device="cpu", method_files=(str(path),))
    assert record.status == "failed", "the test data changed in build() went unseen"
    assert "the test data of task" in record.error and "changed in the method's build()" in record.error


# -- 3. exits and interrupts: that run's failed record, never the sweep's end --------------------------------
EXITS = {
    "sys-exit-0": "sys.exit(0)",
    "sys-exit-3": "sys.exit(3)",
    "system-exit": "raise SystemExit('bye')",
    "keyboard-interrupt": "raise KeyboardInterrupt",
    "generator-exit": "raise GeneratorExit",
}


@pytest.mark.parametrize("where", ["build", "after_task"])
@pytest.mark.parametrize("exit", sorted(EXITS))
def test_an_exit_or_interrupt_inside_a_method_is_a_failed_record(exit, where, tmp_path):
    path = method_file(tmp_path, f"exit-{exit}", **{where: EXITS[exit]})
    record = run_one(make_spec(**{**TINY, "method": f"exit-{exit}"}), device="cpu", method_files=(str(path),))
    assert record.status == "failed"
    assert "raised inside the run: a method may not exit or interrupt the sweep" in record.error


def _exit_files(folder: Path) -> list:
    return [method_file(folder, f"exit-{e}", after_task=code) for e, code in EXITS.items()]


@pytest.mark.parametrize("executor", [["--executor", "inline"], pytest.param(
    ["--executor", "process", "--jobs", "2"], marks=pytest.mark.slow)])  # slow: starts the fork server
def test_a_sweep_goes_on_past_exits_and_interrupts(executor, tmp_path, cli):
    files = _exit_files(tmp_path)
    proto = tiny_protocol(tmp_path, methods=("naive", *(f"exit-{e}" for e in EXITS)), regimes=("head",))
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-progress", "--no-mlflow",
                         "--no-leaderboard", *executor, *[x for f in files for x in ("--method", f)])
    assert code == 0, err
    statuses = {r["spec"]["method"]: r["status"] for r in _records(tmp_path / "res")}
    assert statuses == {"naive": "ok", **{f"exit-{e}": "failed" for e in EXITS}}
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-progress", "--no-mlflow",
                         "--no-leaderboard", *executor, *[x for f in files for x in ("--method", f)])
    assert code == 0 and "to run: 0" in out  # a resume has nothing left to do


def test_the_drivers_own_interrupt_still_stops_the_sweep_even_when_a_method_swallows_it(tmp_path, cli):
    """The signal reaches the driver while a method runs (inline): the sweep stops (exit 130) and that
    run leaves no record, whether the method lets the interrupt through or swallows it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        _interrupt_both_ways(tmp_path, cli)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_both_ways(tmp_path, cli) -> None:
    through = method_file(tmp_path, "sigint-through", after_task="os.kill(os.getpid(), signal.SIGINT)")
    # once, after task 1: a second signal would end the process (test_a_second_signal_stops_the_process...)
    swallowed = method_file(tmp_path, "sigint-swallowed", after_task=(
        "if not hasattr(self, 'sent'):\n    self.sent = True\n"
        "    try:\n        os.kill(os.getpid(), signal.SIGINT)\n    except BaseException:\n        pass"))
    for path, name in ((through, "sigint-through"), (swallowed, "sigint-swallowed")):
        proto = tiny_protocol(tmp_path, name=name, methods=(name, "naive"), regimes=("head",))
        code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-progress",
                             "--no-mlflow", "--no-leaderboard", "--executor", "inline", "--method", path)
        assert code == 130, (name, out, err)
        assert "interrupted (SIGINT)" in out + err
        assert not [r for r in _records(tmp_path / "res", name) if r["spec"]["method"] == name]


@pytest.mark.slow
def test_exits_and_dirty_workers_under_run_timeout_workers(tmp_path, cli, dirty_files):
    files = [*_exit_files(tmp_path), *dirty_files.values()]
    methods = (*(f"dirty-{d}" for d in sorted(DIRTY, reverse=True)), "naive", *(f"exit-{e}" for e in EXITS))
    proto = tiny_protocol(tmp_path, methods=methods, regimes=("head",), orders=1)
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-progress", "--no-mlflow",
                         "--no-leaderboard", "--run-timeout", "120", *[x for f in files for x in ("--method", f)])
    assert code == 0, err
    statuses = {r["spec"]["method"]: r["status"] for r in _records(tmp_path / "res")}
    assert statuses == {"naive": "ok", **{m: "failed" for m in methods if m != "naive"}}


@pytest.mark.slow
def test_exits_and_interrupts_under_ray_are_failed_records(tmp_path, cli):
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    files = _exit_files(tmp_path)
    proto = tiny_protocol(tmp_path, methods=("naive", *(f"exit-{e}" for e in EXITS)), regimes=("head",))
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-progress", "--no-mlflow",
                         "--no-leaderboard", "--executor", "ray", "--jobs", "2",
                         *[x for f in files for x in ("--method", f)])
    assert code == 0, err
    statuses = {r["spec"]["method"]: r["status"] for r in _records(tmp_path / "res")}
    assert statuses == {"naive": "ok", **{f"exit-{e}": "failed" for e in EXITS}}


def _records(results: Path, protocol: str = "tiny") -> list:
    return [json.loads(p.read_text()) for p in (results / protocol / "runs").glob("*.json")]


# -- the driver never depends on the working directory -------------------------------------------------
def test_a_method_that_changes_directory_moves_no_record(tmp_path, cli, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = method_file(tmp_path, "wanders", after_task=f"os.chdir({str(elsewhere)!r})")
    tiny_protocol(tmp_path, methods=("wanders", "naive"), regimes=("head", "full"))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--protocol", "tiny.yaml", "--results", "res", "--no-progress", "--no-mlflow",
                         "--executor", "inline", "--method", path.name)
    assert code == 0, err
    assert len(_records(tmp_path / "res")) == 4
    assert not list(elsewhere.rglob("*")), "a record or site file went where the method moved to"


# -- 4. a last batch of one row on a BatchNorm model ---------------------------------------------------
BN = dict(dataset=DatasetSpec("digits", 2, 2, "mlp-bn"), regime="full", pretrain="none")
FIRST_TASK_ROWS = 269  # digits, classes 0 and 1: train rows of task 1 (270 in task 2)


def _iterations(n: int, batch: int, lone_skipped: bool) -> int:
    return n // batch + (n % batch > 1 or (n % batch == 1 and not lone_skipped))


@pytest.mark.parametrize("batch", [67, 134, 268, 89])  # 269 = 4*67+1 = 2*134+1 = 268+1; 89: 269 = 3*89+2
@pytest.mark.parametrize("path", ["fast", "avalanche"])
def test_a_last_batch_of_one_is_skipped_on_batchnorm_models(batch, path, monkeypatch):
    if path == "avalanche":
        from harness.run import speedups

        monkeypatch.setattr(speedups, "ENABLED", False)
    spec = make_spec(**BN, training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=batch))
    record = run_one(spec, device="cpu")
    assert record.status == "ok", record.error
    expected = _iterations(FIRST_TASK_ROWS, batch, True) + _iterations(270, batch, True)
    assert record.budget["optimizer_steps"] == expected


def test_a_plugin_that_replaces_the_data_falls_back_to_avalanches_loader_and_skips_it_too(tmp_path):
    path = method_file(tmp_path, "own-data", build=(
        "class Own(SupervisedPlugin):\n"
        "    def after_train_dataset_adaptation(self, strategy, **kwargs):\n"
        "        strategy.adapted_dataset = strategy.adapted_dataset.train()\n"
        "ctx_plugins = [Own()]\n"
        "return Naive(**ctx.strategy_kwargs(*ctx_plugins))"))
    spec = make_spec(**BN, method="own-data", training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=67))
    record = run_one(spec, device="cpu", method_files=(str(path),))
    assert record.status == "ok", record.error
    assert record.budget["optimizer_steps"] == _iterations(FIRST_TASK_ROWS, 67, True) + _iterations(270, 67, True)


def test_models_without_batchnorm_still_train_on_the_batch_of_one():
    spec = make_spec(**{**BN, "dataset": DatasetSpec("digits", 2, 2, "mlp")},
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=67))
    record = run_one(spec, device="cpu")
    assert record.budget["optimizer_steps"] == _iterations(FIRST_TASK_ROWS, 67, False) + _iterations(270, 67, False)


def _scenarios(method: str) -> tuple:
    from harness.api.registry import get_registry

    return tuple(get_registry(())[method].scenarios)


def _builtin_methods() -> list[str]:
    from harness.api.registry import get_registry

    return sorted(name for name, adapter in get_registry(()).items() if adapter.source == "built-in")


def _batchnorm_regime(method: str) -> str | None:
    """`full` where the method runs under it, else `head` (SimpleCIL, RanPAC); None for a method that runs on
    prompt regimes only (the prompt pools): no BatchNorm backbone has token blocks."""
    from harness.api.registry import get_registry
    from harness.execution.check import admits

    adapter = get_registry(())[method]
    return next((r for r in ("full", "head") if admits(adapter, r)), None)


def test_only_prompt_only_methods_have_no_batchnorm_regime():
    from harness.api.registry import get_registry

    registry = get_registry(())
    skipped = {m for m in _builtin_methods() if _batchnorm_regime(m) is None}
    assert skipped and all(registry[m].regime_families == ("prompt",) for m in skipped)


@pytest.mark.parametrize("method", [m for m in _builtin_methods() if _batchnorm_regime(m)])
def test_every_builtin_method_survives_a_last_batch_of_one_on_batchnorm(method):
    # Methods with passes of their own (BECAME's Fisher, a merged model's recomputed statistics) skip it too.
    hparams = {"batchnorm": "recompute"} if method in {"magmax", "ties", "task-arithmetic"} else {}
    if method == "ranpac":
        hparams = {"M": 64}  # the default M=10000 makes this a 10000x10000 solve per λ on CPU (~8 min)
    scenario = "task-il" if "task-il" in _scenarios(method) else "class-il"  # iCaRL, BiC: class-IL only
    spec = make_spec(**{**BN, "regime": _batchnorm_regime(method)}, method=method, hparams=hparams, scenario=scenario,
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=2, batch_size=67))
    record = run_one(spec, device="cpu")
    assert record.status == "ok", f"{method}: {record.error}"


# -- 4b. which models take a batch of one: a forward of one row decides, not the presence of BatchNorm --------
def _maps_npz(folder: Path) -> str:
    """Two classes of 3x16x16 images (resnet18-reduced's last stage then works on 2x2 maps)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(41, 3, 16, 16)).astype("float32"), np.arange(41) % 2
    path = folder / "maps.npz"
    np.savez(path, x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    return f"npz:{path}"


ONE_ROW_CASES = [  # (model, data set, regime): every built-in backbone, on maps of several sizes
    ("mlp", "digits", "full"), ("mlp-bn", "digits", "full"), ("mlp-bn", "digits", "head"),
    ("small-cnn", "digits", "full"), ("small-cnn", "maps", "last-1"), ("cnn1d", "mnist1d", "full"),
    ("resnet18-reduced", "digits", "full"), ("resnet18-reduced", "maps", "full"), ("resnet18", "digits", "last-1"),
]


def _one_row_trains(spec, input_shape) -> bool:
    """The independent truth: the run's model, in its regime's train mode, on one row."""
    from harness.run.engine import build_run_model
    from harness.run.regimes import apply_regime

    model = build_run_model(spec, input_shape)
    apply_regime(model, spec.regime)
    model.train()
    try:
        model(torch.randn(1, *input_shape), torch.zeros(1, dtype=torch.long))
    except ValueError as exc:
        assert "Expected more than 1 value per channel" in str(exc)
        return False
    return True


@pytest.mark.parametrize(("model", "data", "regime"), ONE_ROW_CASES)
def test_a_last_batch_of_one_trains_exactly_where_the_model_can_take_one_row(model, data, regime, tmp_path):
    from harness.run.datasets import load_dataset
    from harness.run.streams import split_tasks

    name = _maps_npz(tmp_path) if data == "maps" else data
    n_tasks = 1 if data == "maps" else 2
    loaded = load_dataset(name)
    sizes = [len(t.y_train) for t in split_tasks(loaded, tuple(range(10)), n_tasks, 2)]
    batch = max(b for b in range(2, 100) if sizes[0] % b == 1)  # task 1 ends with a batch of one row
    spec = make_spec(dataset=DatasetSpec(name, n_tasks, 2, model), regime=regime, pretrain="none",
                     training=TrainingSpec(lr=0.01, momentum=0.9, epochs=1, batch_size=batch))
    trains = _one_row_trains(spec, loaded.input_shape)
    kept = []

    def own_pass(event, t, strategy):  # a method's own pass over data (BECAME's Fisher) keeps what trains
        if event == "before_task" and t == 0:
            from harness.methods.gpm import without_lone_batches

            strategy.model.train()
            x = loaded.x_train[:3]
            kept.append(len(list(without_lone_batches(strategy.model, [(x[:2], 0), (x[2:], 0)]))))

    record = run_one(spec, device="cpu", observer=own_pass)
    assert record.status == "ok", record.error
    assert record.budget["optimizer_steps"] == sum(_iterations(n, batch, not trains) for n in sizes)
    assert kept == [2 if trains else 1]


# -- 5. the user's Ctrl-C outside a sweep (reproduce, check) and a second one after a swallowed first ---------
MARK = "CL_BENCH_TEST_MARK"  # set: the method's build() marks that it runs, then sleeps for ever
SLEEPS = f"import time\nmark = os.environ.get({MARK!r})\nif mark:\n    open(mark, 'w').close()\n"
SLEEPER = SLEEPS + "    while True:\n        time.sleep(0.02)"
SWALLOWER = SLEEPS + ("    while True:\n        try:\n            time.sleep(0.02)\n"
                      "        except BaseException:\n            open(mark + '.swallowed', 'w').close()")


def _started(command: list, mark: Path) -> subprocess.Popen:
    """`cl-bench COMMAND` in a process of its own, once its method runs (the mark exists)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", MARK: str(mark), "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, command)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _wait_for(lambda: mark.exists() or proc.poll() is not None, proc)
    assert proc.poll() is None, proc.stdout.read()
    return proc


def _wait_for(condition, proc, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"timed out: {proc.communicate()[0]}")
        time.sleep(0.02)


def _finish(proc: subprocess.Popen) -> str:
    try:
        return proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _sleeper_record(tmp_path, cli, monkeypatch, build: str) -> tuple[Path, dict]:
    """A method file whose build() sleeps while MARK is set, and the record of a run made without it."""
    path = method_file(tmp_path, "sleeper", build=build)
    monkeypatch.delenv(MARK, raising=False)
    proto = tiny_protocol(tmp_path, methods=("sleeper",), regimes=("head",))
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", "--no-progress", "--no-mlflow",
                         "--no-leaderboard", "--executor", "inline", "--method", path)
    assert code == 0, err
    [record] = _records(tmp_path / "res")
    return path, record


def _command(command: str, tmp_path, path: Path, record: dict | None) -> list:
    if command == "run":
        return ["run", "--protocol", tmp_path / "tiny.yaml", "--results", tmp_path / "res", "--no-progress",
                "--no-mlflow", "--no-leaderboard", "--executor", "inline", "--method", path]
    if command == "reproduce":
        return ["reproduce", record["run_id"], "--results", tmp_path / "res", "--out", tmp_path / "out",
                "--method", path]
    return ["check", path]


@pytest.mark.parametrize("command", ["reproduce", pytest.param("check", marks=pytest.mark.slow)])
def test_ctrl_c_stops_reproduce_and_check_and_writes_no_record(command, tmp_path, cli, monkeypatch):
    path, record = _sleeper_record(tmp_path, cli, monkeypatch, SLEEPER)
    proc = _started(_command(command, tmp_path, path, record), tmp_path / "mark")
    proc.send_signal(signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, out  # 128 + SIGINT, as an interrupted sweep
    assert "interrupted (SIGINT)" in out and "Traceback" not in out, out
    assert "failed" not in out and "finding" not in out, out  # the interrupt is no verdict on the method
    assert not list((tmp_path / "out").rglob("*.json")), "an interrupted rerun left a record"


@pytest.mark.parametrize(("command", "sig"), [
    ("run", signal.SIGINT), pytest.param("reproduce", signal.SIGTERM, marks=pytest.mark.slow),
    pytest.param("check", signal.SIGINT, marks=pytest.mark.slow)])
def test_a_second_signal_stops_the_process_when_a_method_swallows_the_first(command, sig, tmp_path, cli,
                                                                              monkeypatch):
    path, record = _sleeper_record(tmp_path, cli, monkeypatch, SWALLOWER) if command == "reproduce" else (
        method_file(tmp_path, "sleeper", build=SWALLOWER), None)
    tiny_protocol(tmp_path, methods=("sleeper",), regimes=("head",))
    mark = tmp_path / "mark"
    proc = _started(_command(command, tmp_path, path, record), mark)
    proc.send_signal(sig)
    _wait_for(lambda: Path(f"{mark}.swallowed").exists(), proc)
    time.sleep(0.2)
    assert proc.poll() is None, "the method swallowed the first signal: the process goes on"
    proc.send_signal(sig)
    out = _finish(proc)
    assert proc.returncode == -sig, out  # ended by the signal itself
    if command != "check":
        folder = tmp_path / ("out" if command == "reproduce" else "res")
        assert not list(folder.rglob("*.json")), "the interrupted run left a record"
