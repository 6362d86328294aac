"""The harness's own Avalanche plugins, handed to every adapter through `ctx.plugins`."""
from __future__ import annotations

import math

from .. import compat  # noqa: F401
from avalanche.core import SupervisedPlugin


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""


class HarnessPlugin(SupervisedPlugin):
    """Counts training iterations (proof that the adapter passed the plugins through) and
    stops a run as soon as its loss is no longer finite."""

    def __init__(self):
        super().__init__()
        self.iterations = 0
        self.experiences = 0

    def before_training_exp(self, strategy, **kwargs):
        self.experiences += 1

    def after_backward(self, strategy, **kwargs):
        self.iterations += 1
        loss = float(strategy.loss.detach())
        if not math.isfinite(loss):
            raise DivergedError(f"training loss became {loss} at iteration {self.iterations}")
