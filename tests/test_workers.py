"""Worker processes: forked from a preloaded server, yet with the driver's current state; GPUs in turn."""
import json
import os
import sys

import pytest

from harness.config.errors import SweepError
from harness.execution.executors import ProcessExecutor, RunOptions, base, uses_worker_processes


def report_state(spec, options):
    """A stand-in run: the worker's state as the record's error text."""
    from harness.config.specs import failed_record

    state = {"cwd": os.getcwd(), "env": os.environ.get("CLB_TEST_MARK"), "pid": os.getpid(),
             "preloaded": "avalanche.training.templates" in sys.modules,
             "threads": __import__("torch").get_num_threads(),
             "in_path": options.data_dir in sys.path}
    return failed_record(spec, json.dumps(state), status="failed")


class Reporting(ProcessExecutor):
    worker = staticmethod(report_state)


def _states(tmp_path, spec_factory, n=2):
    specs = [spec_factory(order=i) for i in range(n)]
    records = list(Reporting(RunOptions(data_dir=str(tmp_path)), jobs=2).run(specs))
    return [json.loads(r.error) for r in records]


def test_workers_adopt_the_drivers_current_state_not_the_servers(tmp_path, spec_factory, monkeypatch):
    base.start_worker_server()  # the server forks from its state at this moment
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLB_TEST_MARK", "set-after-the-server-started")
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    for state in _states(tmp_path, spec_factory):
        assert state["cwd"] == str(tmp_path)
        assert state["env"] == "set-after-the-server-started"
        assert state["in_path"] and state["threads"] == 1
        assert state["pid"] != os.getpid()


def test_forked_workers_start_with_the_stack_imported(tmp_path, spec_factory):
    if "forkserver" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip("no fork server on this platform")
    assert all(s["preloaded"] for s in _states(tmp_path, spec_factory))


def test_spawned_workers_are_one_variable_away(tmp_path, spec_factory, monkeypatch):
    monkeypatch.setenv(base.START_METHOD_ENV, "spawn")
    assert base.worker_context().get_start_method() == "spawn"
    states = _states(tmp_path, spec_factory, n=1)  # one spawned worker: a fresh interpreter's imports
    assert len(states) == 1 and states[0]["cwd"] == os.getcwd() and states[0]["pid"] != os.getpid()


def test_an_unknown_start_method_is_one_clear_line(monkeypatch):
    monkeypatch.setenv(base.START_METHOD_ENV, "fork")
    with pytest.raises(SweepError, match=r"\$CL_BENCH_START_METHOD='fork'; allowed: forkserver, spawn"):
        base.worker_context()


def test_workers_take_the_visible_gpus_in_turn(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    gpus = base.visible_gpus("cuda")
    assert gpus == ("2", "5", "7")
    assert [base.gpu_for_worker(i, gpus) for i in range(7)] == ["2", "5", "7", "2", "5", "7", "2"]
    assert base.visible_gpus("cpu") == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # one GPU: nothing to spread, leave it be
    assert base.visible_gpus("auto") == () and base.gpu_for_worker(0, ()) is None


def test_a_pool_worker_claims_the_next_gpu(monkeypatch):
    import multiprocessing

    counter = multiprocessing.get_context("spawn").Value("i", 1)
    setup = base.WorkerSetup(1, {"KEEP": "1"}, os.getcwd(), tuple(sys.path), gpus=("0", "1"))
    env = dict(os.environ)
    try:
        base.init_forked_worker(setup, counter)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1" and os.environ["KEEP"] == "1"
        assert counter.value == 2
    finally:
        os.environ.clear()
        os.environ.update(env)


def test_which_requests_use_worker_processes():
    assert uses_worker_processes("process", 2, None) and uses_worker_processes("inline", 1, 5.0)
    assert not uses_worker_processes("process", 1, None) and not uses_worker_processes("ray", 4, None)
