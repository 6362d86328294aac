"""--run-timeout counts a run's own time only; --retry-failed reruns timeouts; NaN errors say where."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.execution.store import load_records

pytestmark = pytest.mark.slow  # every test here trains real models (runs, sweeps)

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ("--no-progress", "--no-mlflow", "--no-leaderboard")

# Imported by every worker at warm-up: makes the worker's first load of digits take 3 s, a
# one-time setup cost that a 2 s --run-timeout must not count (the test process is left alone).
SLOW_SETUP = '''
    import multiprocessing
    import time

    if multiprocessing.parent_process() is not None:
        import dataclasses

        from harness.api import plugins
        from harness.run import datasets  # noqa: F401  (registers the built-in data sets)

        digits = plugins.lookup("dataset", "digits").plugin
        load = digits.load

        def slow_first_load(*args):
            time.sleep(3)
            return load(*args)

        plugins.register_builtins(dataclasses.replace(digits, load=slow_first_load))

    ADAPTERS = ()
    '''

# Hangs while FLAG exists, else trains like naive (same file, so the same run id both times).
STALL = '''
    import time
    from pathlib import Path

    from avalanche.training import Naive
    from harness.api.contract import MethodAdapter

    def build(ctx):
        while Path({flag!r}).exists():
            time.sleep(0.1)
        return Naive(**ctx.strategy_kwargs())

    ADAPTERS = (MethodAdapter("stall", {{}}, build, "hangs while a flag file exists"),)
    '''

# NaN loss from the second task on.
NAN_LATER = '''
    from avalanche.core import SupervisedPlugin
    from avalanche.training import Naive
    from harness.api.contract import MethodAdapter

    class NanFromTask2(SupervisedPlugin):
        def before_backward(self, strategy, **kw):
            if strategy.clock.train_exp_counter >= 1:
                strategy.loss = strategy.loss * float("nan")

    def build(ctx):
        return Naive(**ctx.strategy_kwargs(NanFromTask2()))

    ADAPTERS = (MethodAdapter("nan_later", {}, build, "NaN loss from task 2 on"),)
    '''


def _protocol(folder: Path, methods: str) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: tiny
        version: "1"
        datasets: [{{name: digits, n_tasks: 2, classes_per_task: 2, model: mlp}}]
        regimes: [head]
        methods: [{methods}]
        task_orders: {{count: 1, seed: 0}}
        seeds: [0]
        training: {{optimizer: sgd, lr: 0.05, epochs: 1, batch_size: 32}}
        """))
    return path


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def timed_sweep(tmp_path_factory):
    """A --run-timeout 2 sweep of naive and stall (flag set) with a slow first-time setup."""
    folder = tmp_path_factory.mktemp("timeouts")
    flag = folder / "hang"
    flag.write_text("hang")
    files = {"slow": folder / "slow_setup.py", "stall": folder / "stall.py"}
    files["slow"].write_text(textwrap.dedent(SLOW_SETUP))
    files["stall"].write_text(textwrap.dedent(STALL.format(flag=str(flag))))
    argv = ["run", "--protocol", _protocol(folder, "naive, stall"), "--method", files["slow"],
            "--method", files["stall"], "--run-timeout", "2", *SWEEP]
    results = folder / "res"
    code = main([str(a) for a in (*argv, "--results", results)])
    assert code == 0
    return {"argv": argv, "results": results, "flag": flag}


def _by_method(results: Path) -> dict:
    return {r.spec.method: r for r in load_records(results, "tiny")}


def test_run_timeout_does_not_count_a_workers_first_time_setup(timed_sweep, monkeypatch):
    monkeypatch.chdir(ROOT)
    records = _by_method(timed_sweep["results"])
    assert records["naive"].status == "ok", records["naive"].error
    assert records["stall"].status == "timeout"
    assert "timed out after 2 s (--run-timeout)" in records["stall"].error


def test_retry_failed_reruns_a_timeout_record_and_a_plain_rerun_keeps_it(timed_sweep, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.chdir(ROOT)
    results = tmp_path / "res"
    shutil.copytree(timed_sweep["results"], results)
    argv = [*timed_sweep["argv"], "--results", results]
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    assert "done: 2   to run: 0" in out
    assert _by_method(results)["stall"].status == "timeout"

    timed_sweep["flag"].unlink()  # the stalling method now trains: a rerun can only end ok
    code, out, err = _cli(capsys, *argv, "--retry-failed")
    assert code == 0, err
    assert "done: 1   to run: 1" in out
    assert {m: r.status for m, r in _by_method(results).items()} == {"naive": "ok", "stall": "ok"}


def test_nan_error_names_the_task_and_epoch(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    method = tmp_path / "nan_later.py"
    method.write_text(textwrap.dedent(NAN_LATER))
    results = tmp_path / "res"
    code, out, err = _cli(capsys, "run", "--protocol", _protocol(tmp_path, "nan_later"), "--method", method,
                          "--results", results, *SWEEP)
    assert code == 0, err
    (record,) = load_records(results, "tiny")
    assert record.status == "diverged"
    assert "training loss became nan in task 2, epoch 1, iteration 1 (" in record.error, record.error
    assert "iteration of the run)" in record.error
