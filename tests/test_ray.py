"""Executors under faults: Ray (local, 2 CPUs) against inline, and workers that kill themselves."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.execution.store import load_records

ROOT = Path(__file__).resolve().parent.parent
KILLERS = '''"""Adapters that kill the process running them (executor fault-tolerance tests)."""
import os
from pathlib import Path

from harness.api.contract import MethodAdapter

MARKER = Path({marker!r})


def build_once(ctx):
    """SIGKILLs its process on the first attempt only, then trains like naive."""
    if not MARKER.exists():
        MARKER.write_text("died once")
        os.kill(os.getpid(), 9)
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs())


ADAPTERS = (MethodAdapter("kill-once", {{}}, build_once, "dies once, then naive"),)
'''
PROTOCOL = """\
name: killers
version: "1"
description: executor fault tolerance
scenario: task-il
pretrain: first-task
datasets:
  - {name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}
regimes: [full]
methods: [naive, {name: lwf, hparams: {alpha: 1.0, temperature: 2.0}}, kill-once]
task_orders: {count: 1, seed: 0}
seeds: [0]
training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 32}
evaluation: {batch_size: 512}
"""


def _killers(folder: Path) -> list[str]:
    (folder / "killers.py").write_text(KILLERS.format(marker=str(folder / "died-once")))
    (folder / "killers.yaml").write_text(PROTOCOL)
    return ["--protocol", str(folder / "killers.yaml"), "--method", str(folder / "killers.py")]


def _sweep(results: Path, *argv) -> dict:
    code = main(["run", "--results", str(results), "--no-progress", "--no-leaderboard", "--no-mlflow", *argv])
    assert code == 0
    return {r.spec.method: r.to_dict() for r in load_records(results)}


@pytest.fixture(scope="module")
def ray_sweep(tmp_path_factory):
    """One sweep on a local 2-CPU Ray (each fresh worker costs seconds of imports, so it is
    shared): naive and lwf, plus a run that SIGKILLs its worker on its first attempt."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (pip install 'cl-bench[ray]')")
    from harness.execution.executors.ray import start_ray

    folder = tmp_path_factory.mktemp("ray")
    started = start_ray(ray, None, 2)
    try:
        records = _sweep(folder / "results", *_killers(folder), "--executor", "ray", "--jobs", "2",
                         "--max-retries", "1")
    finally:
        if started:
            ray.shutdown()
    return folder, records


@pytest.mark.slow
def test_ray_sweep_equals_inline(ray_sweep):
    folder, on_ray = ray_sweep
    inline = _sweep(folder / "inline", *_killers(folder), "--methods", "naive,lwf", "--executor", "inline")
    assert sorted(inline) == ["lwf", "naive"]
    for method, rec in inline.items():
        other = on_ray[method]
        assert other["status"] == rec["status"] == "ok"
        assert other["run_id"] == rec["run_id"]
        assert other["acc_matrix"] == rec["acc_matrix"] and other["metrics"] == rec["metrics"]
        assert other["update_norms"]["shared"][1:] == pytest.approx(rec["update_norms"]["shared"][1:], rel=1e-9)


@pytest.mark.slow
def test_ray_worker_death_is_retried(ray_sweep):
    folder, records = ray_sweep
    assert sorted(records) == ["kill-once", "lwf", "naive"]  # one record each, none lost
    assert len(list((folder / "results" / "killers" / "runs").glob("*.json"))) == 3
    assert (folder / "died-once").exists()                   # kill-once did kill its worker ...
    assert records["kill-once"]["status"] == "ok"           # ... and its retry succeeded
    assert records["kill-once"]["acc_matrix"] == records["naive"]["acc_matrix"]


@pytest.mark.parametrize("error, expected", [
    ("WorkerCrashedError", "worker lost after 1 retries: WorkerCrashedError"),
    ("NodeDiedError", "worker lost after 1 retries: NodeDiedError: node gone"),
])
def test_ray_lost_worker_becomes_a_failed_record(spec_factory, error, expected):
    """What ray.get raises once retries are spent becomes a failed record of that spec."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    from harness.execution.executors.ray import _record

    exc = getattr(ray.exceptions, error)(*(["node gone"] if error == "NodeDiedError" else []))

    class FakeRay:
        exceptions = ray.exceptions

        @staticmethod
        def get(ref):
            raise exc

    spec = spec_factory()
    record = _record(FakeRay, object(), spec, 1)
    assert (record.run_id, record.status, record.metrics) == (spec.run_id, "failed", {})
    assert record.error.startswith(expected)


def fake_run(spec, options):
    """Stand-in for a run in a worker process: 'die' kills its worker, others take a moment."""
    import os
    import time

    from harness.config.specs import failed_record

    folder = Path(options.data_dir)
    with open(folder / f"{spec.method}.attempts", "a") as fh:
        fh.write("x")
    if spec.method == "die":  # die while 'slow' is in flight (it has started: its file exists)
        for _ in range(2000):
            if (folder / "slow.attempts").exists():
                os._exit(3)
            time.sleep(0.01)
    if spec.method == "slow":  # stay in flight until 'die' has started (however slowly its worker spawns)
        for _ in range(3000):
            if (folder / "die.attempts").exists():
                break
            time.sleep(0.01)
        time.sleep(2.0)
    return failed_record(spec, None, status="ok")


def no_init(*_):
    """No torch in the fake workers: they start in a fraction of a second."""


def test_process_pool_survives_a_dying_worker(tmp_path, spec_factory):
    """A worker that dies breaks the pool: the bystander is rerun alone, the culprit is rerun
    alone `max_retries` times and then recorded as failed; every spec yields one record."""
    from harness.execution.executors import ProcessExecutor, RunOptions

    class Fake(ProcessExecutor):
        worker = staticmethod(fake_run)
        initializer = staticmethod(no_init)

    specs = [spec_factory(method=m) for m in ("die", "slow", "fast")]
    records = list(Fake(RunOptions(data_dir=str(tmp_path)), jobs=2, max_retries=1).run(specs))
    by_method = {r.spec.method: r for r in records}
    assert sorted(r.run_id for r in records) == sorted(s.run_id for s in specs)
    assert by_method["die"].status == "failed" and "worker process died" in by_method["die"].error
    assert by_method["slow"].status == by_method["fast"].status == "ok"
    attempts = {s.method: len((tmp_path / f"{s.method}.attempts").read_text()) for s in specs}
    # die: with slow in the pool, then alone until it has died alone max_retries + 1 times. Whether the
    # broken pool also fails slow's in-flight future is CPython's timing (measured: both happen, more
    # often on a loaded machine): slow then runs again alone, else it finishes in the first pool. Where
    # die's worker is held off the CPU until slow has finished (seen once in a CI rehearsal under load),
    # fast starts in the freed worker, is in flight when die breaks the pool, and runs again alone.
    assert attempts["fast"] in (1, 2) and attempts["slow"] in (1, 2) and attempts["die"] in (2, 3)


def test_ray_flags_need_the_ray_executor(capsys):
    assert main(["run", "--protocol", "smoke", "--executor", "inline", "--num-gpus", "1",
                 "--results", "/nonexistent-never-written", "--no-mlflow"]) == 2
    assert "--num-gpus: only applies to --executor ray" in capsys.readouterr().err


def test_unreachable_ray_address_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    code = main(["run", "--protocol", str(ROOT / "protocols" / "smoke.yaml"), "--executor", "ray",
                 "--ray-address", "127.0.0.1:1", "--results", str(tmp_path), "--no-mlflow", "--no-progress"])
    assert code == 2
    assert "--ray-address: nothing answers at 127.0.0.1:1" in capsys.readouterr().err
