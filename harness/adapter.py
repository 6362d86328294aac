"""The method adapter interface: what an adapter receives (`MethodContext`) and is."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import compat  # noqa: F401  (quirks first)
from .specs import TrainingSpec


@dataclass(frozen=True)
class MethodAdapter:
    """A registered method: `build(ctx, **hparams)` returns an Avalanche strategy."""

    name: str
    defaults: dict
    build: Callable[..., Any]
    description: str = ""
    reference: str = ""
    source: str = "built-in"
    family: str = ""


@dataclass(frozen=True)
class MethodContext:
    """Everything an adapter needs to build its strategy for one run.

    `model` is already frozen to the run's regime; `optimizer` covers its trainable
    parameters only (the harness keeps it that way at every task boundary). `plugins` are
    the harness's own Avalanche plugins: a strategy must include them.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    criterion: torch.nn.Module
    train_mb_size: int
    eval_mb_size: int
    train_epochs: int
    device: torch.device
    plugins: tuple
    n_tasks: int
    regime: str
    pretrain: str
    scenario: str
    seed: int
    training: TrainingSpec = field(default_factory=TrainingSpec)
    # The run's tasks (streams.Task: train/test tensors). For diagnostics only (e.g. BECAME's
    # α-sweep on seen tasks' test data); training must use the experiences it is given.
    tasks: tuple = ()

    def strategy_kwargs(self, *extra_plugins) -> dict:
        """Keyword arguments every SupervisedTemplate subclass accepts, harness plugins included."""
        return dict(model=self.model, optimizer=self.optimizer, criterion=self.criterion,
                    train_mb_size=self.train_mb_size, train_epochs=self.train_epochs,
                    eval_mb_size=self.eval_mb_size, device=self.device,
                    plugins=[*self.plugins, *extra_plugins], evaluator=quiet_evaluator())

    def new_optimizer(self, params=None, lr: float | None = None) -> torch.optim.Optimizer:
        """A fresh optimizer of the protocol's kind (default: over the trainable parameters)."""
        if params is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
        return make_optimizer(self.training, params, lr=lr)


def make_optimizer(training: TrainingSpec, params, lr: float | None = None) -> torch.optim.Optimizer:
    """Build the protocol's optimizer over `params`."""
    lr = training.lr if lr is None else lr
    params = list(params)
    if training.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=training.momentum,
                               weight_decay=training.weight_decay)
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=training.weight_decay)
    if training.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=training.weight_decay)
    raise ValueError(f"unknown optimizer {training.optimizer!r}; allowed: sgd, adam, adamw")


OPTIMIZERS = ("sgd", "adam", "adamw")


def quiet_evaluator():
    """An Avalanche evaluator with no metrics and no loggers: the harness measures itself."""
    from avalanche.training.plugins import EvaluationPlugin

    return EvaluationPlugin(loggers=[])
