"""Fixtures of the fault suite: a tiny protocol file and hostile method files.

The socket guard (`no_network`) and the in-process CLI (`cli`) are in tests/conftest.py.
"""
from __future__ import annotations

import signal
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tiny_protocol(folder: Path, name: str = "tiny", methods=("naive",), regimes=("head", "full"),
                  orders: int = 1, extra: str = "") -> Path:
    """Write a fast protocol (digits, 3 tasks x 2 classes, MLP, 1 epoch) and return its path."""
    path = Path(folder) / f"{name}.yaml"
    method_list = ", ".join(methods)
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        version: "1"
        datasets: [{{name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}}]
        regimes: [{", ".join(regimes)}]
        methods: [{method_list}]
        task_orders: {{count: {orders}, seed: 0}}
        seeds: [0]
        training: {{optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 64}}
        """) + extra)
    return path


# Adapters that misbehave in each way the harness must survive (one module per file).
BAD_METHODS = {
    "raises": '''
        from harness.api.contract import MethodAdapter

        def build(ctx):
            raise RuntimeError("<b>boom</b> from a broken method")

        ADAPTERS = (MethodAdapter("raises", {}, build, "always raises"),)
        ''',
    "nan": '''
        import torch
        from avalanche.core import SupervisedPlugin
        from avalanche.training import Naive
        from harness.api.contract import MethodAdapter

        class Poison(SupervisedPlugin):
            def before_forward(self, strategy, **kw):
                with torch.no_grad():
                    next(iter(strategy.model.heads.parameters())).fill_(float("nan"))

        def build(ctx):
            return Naive(**ctx.strategy_kwargs(Poison()))

        ADAPTERS = (MethodAdapter("nan", {}, build, "poisons a head with NaN"),)
        ''',
    "hangs": '''
        import time
        from harness.api.contract import MethodAdapter

        def build(ctx):
            time.sleep(3600)

        ADAPTERS = (MethodAdapter("hangs", {}, build, "never returns"),)
        ''',
}


@pytest.fixture
def bad_method_files(tmp_path):
    """{name: path} of the misbehaving adapter files."""
    files = {}
    for name, code in BAD_METHODS.items():
        files[name] = tmp_path / f"bad_{name}.py"
        files[name].write_text(textwrap.dedent(code))
    return files


class Hung(BaseException):
    """Not an OSError (as TimeoutError is): no `except OSError` on the way out may take it for a read error."""


@contextmanager
def deadline(seconds: int = 20):
    """Fail instead of hanging (an open of a FIFO blocks until a writer comes)."""
    def expired(*_):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
