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
            raise DivergedError(f"training loss became {loss} {self._where(strategy)}")

    def _where(self, strategy) -> str:
        """Where training is, by the strategy's clock: 1-based task, epoch and iteration."""
        clock = getattr(strategy, "clock", None)
        try:  # the clock counts finished experiences, epochs and iterations (0-based here)
            task, epoch = clock.train_exp_counter + 1, clock.train_exp_epochs + 1
            iteration = clock.train_epoch_iterations + 1
        except AttributeError:  # a template without Avalanche's clock: the harness's own counts
            return f"in task {self.experiences}, at iteration {self.iterations} of the run"
        return (f"in task {task}, epoch {epoch}, iteration {iteration} "
                f"({ordinal(self.iterations)} iteration of the run)")


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
