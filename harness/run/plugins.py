"""The harness's own Avalanche plugins, handed to every adapter through `ctx.plugins`."""
from __future__ import annotations

import math
from contextlib import nullcontext

import harness.compat  # noqa: F401

from avalanche.core import SupervisedPlugin

from ..api.contract import TRAINING_STAGE_ATTRIBUTE, evaluated_model_now


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""


class HarnessPlugin(SupervisedPlugin):
    """Counts training iterations (proof that the adapter passed the plugins through; a feature pass without a
    gradient step counts, see methods/prototypes.py), measures
    the training budget and the losses of each task, and stops a run as soon as its loss is no
    longer finite.

    Budget, per task: optimizer steps (`after_update` calls), samples seen (minibatch sizes,
    replayed samples included) and epochs per training stage (a strategy that trains in
    stages names the current one in `harness_stage`). Work outside the training loop (a
    Fisher estimate, a GPM memory update) is not an optimizer step and is not counted.

    `continual` (a harness.run.evaluation.ContinualEvaluator, or None: off): after each optimizer step
    it may evaluate the model the method would output now (every k steps of a task: `evaluated_model_now`,
    the trained model unless the method says otherwise), a point of the run's curve.
    """

    def __init__(self, continual=None):
        super().__init__()
        self.continual = continual
        self.compute = None  # the run's compute.ComputeMeter: its curve points are the harness's, not the method's
        self.iterations = 0
        self.experiences = 0
        self.steps_per_task: list[int] = []
        self.samples_per_task: list[int] = []
        self.epochs_per_stage: list[list[int]] = []
        self.losses: list[list[float]] = []  # per task: the loss of every iteration

    def before_training_exp(self, strategy, **kwargs):
        self.experiences += 1
        self.steps_per_task.append(0)
        self.samples_per_task.append(0)
        self.epochs_per_stage.append([])
        self.losses.append([])
        self._stage = object()

    def before_training_iteration(self, strategy, **kwargs):
        # Counted here, not at the backward pass: a method whose training takes no gradient step (a prototype
        # or ridge classifier computed from a feature pass over the task's minibatches) runs iterations too.
        self.iterations += 1

    def after_backward(self, strategy, **kwargs):
        loss = float(strategy.loss.detach())
        if not math.isfinite(loss):
            raise DivergedError(f"training loss became {loss} {self._where(strategy)}")
        if self.losses:
            self.losses[-1].append(loss)

    def after_update(self, strategy, **kwargs):
        if self.steps_per_task:
            self.steps_per_task[-1] += 1
            self.samples_per_task[-1] += len(strategy.mbatch[0])
            if self.continual is not None:
                with self.compute.stage_of(None) if self.compute is not None else nullcontext():
                    self.continual.after_step(lambda: evaluated_model_now(strategy), self.steps_per_task[-1],
                                              sum(self.steps_per_task))

    def after_training_epoch(self, strategy, **kwargs):
        if not self.epochs_per_stage:
            return
        stage = getattr(strategy, TRAINING_STAGE_ATTRIBUTE, None)
        epochs = self.epochs_per_stage[-1]
        if not epochs or stage != self._stage:
            epochs.append(0)
            self._stage = stage
        epochs[-1] += 1

    def budget(self) -> dict:
        """The run's training budget so far (see the class docstring)."""
        return {"optimizer_steps": sum(self.steps_per_task), "samples_seen": sum(self.samples_per_task),
                "steps_per_task": list(self.steps_per_task), "samples_per_task": list(self.samples_per_task),
                "epochs_per_stage": [list(e) for e in self.epochs_per_stage]}

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
