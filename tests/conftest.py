"""Shared fixtures: tiny run specs and an isolated cache."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _is_loopback(address) -> bool:
    import ipaddress

    host = address[0] if isinstance(address, tuple) else address
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Fail any test in which code opens a non-loopback network connection (list of attempts)."""
    import errno
    import socket

    attempts = []

    def guard(real, address_at):
        def guarded(sock, *args):
            address = args[address_at] if len(args) > address_at else None
            if sock.family in (socket.AF_INET, socket.AF_INET6) and address is not None \
                    and not _is_loopback(address):
                attempts.append(address)
                raise OSError(errno.ENETUNREACH, f"test socket guard: no network in tests ({address!r})")
            return real(sock, *args)
        return guarded

    for name, at in (("connect", 0), ("connect_ex", 0), ("sendto", -1)):
        monkeypatch.setattr(socket.socket, name, guard(getattr(socket.socket, name), at))
    yield attempts
    if attempts:
        pytest.fail(f"network connection attempted during the test: {attempts}")


def make_spec(**overrides):
    """A small, fast RunSpec on digits (5 tasks x 2 classes, MLP); override any field (`pretrain` may
    be given in its JSON form: "none", a recipe mapping)."""
    from harness.config.pretrain import Pretrain
    from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec

    fields = dict(protocol="test", protocol_version="1", dataset=DatasetSpec("digits", 5, 2, "mlp"),
                  regime="last-1", method="naive", label="", hparams={}, order=0,
                  class_order=tuple(range(10)), seed=0, scenario="task-il", pretrain="first-task",
                  training=TrainingSpec(lr=0.05, momentum=0.9, epochs=2, batch_size=32),
                  eval_batch_size=512)
    fields.update(overrides)
    if not isinstance(fields["pretrain"], Pretrain):
        fields["pretrain"] = Pretrain.from_json(fields["pretrain"])
    return RunSpec(**fields)


@pytest.fixture
def spec_factory():
    """`make_spec` as a fixture."""
    return make_spec


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `cl-bench ARGS` in-process from the repository root; returns (exit code, stdout, stderr) of
    that call (arguments may be paths; `--help` gives its SystemExit code)."""
    from harness.cli import main

    monkeypatch.chdir(ROOT)

    def invoke(*argv):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def cl_bench_cmd() -> list[str]:
    """Command prefix that runs the CLI in a subprocess with this interpreter."""
    return [sys.executable, "-m", "harness.cli"]


def record_from(partial: dict):
    """A RunRecord from a partial JSON record: the spec is completed from `make_spec()`'s, every
    other missing key is empty (hand-made records for analysis and site tests)."""
    from harness.config.specs import RunRecord

    spec = {**make_spec().to_dict(), **(partial.get("spec") or {})}
    empty = dict(run_id="x", status="ok", error=None, acc_matrix=[], init_acc=[], metrics={}, update_norms={},
                 diagnostics={}, params={}, regime_depth=None, n_blocks=None, timings={}, provenance={},
                 schema_version=1)
    return RunRecord.from_dict({**empty, **partial, "spec": spec})


def fixture_records(path) -> list:
    """The records of a committed fixture file (hand-made run ids: parsed, not verified)."""
    import json

    from harness.config.specs import RunRecord

    return [RunRecord.from_dict(d) for d in json.loads(Path(path).read_text())]


def run_recording_memory(spec, **kwargs):
    """`run_one(spec)` and what the method declared it keeps after each task (a MemoryUse per task)."""
    from harness.api.contract import memory_use
    from harness.run.engine import run_one

    memory = []
    record = run_one(spec, device="cpu", observer=lambda event, t, strategy: memory.append(memory_use(strategy))
                     if event == "after_task" else None, **kwargs)
    return record, memory
