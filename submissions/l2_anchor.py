"""L2 anchor: penalise the distance of the shared parameters to their values after the previous task.

Written from scratch as an Avalanche plugin on top of plain sequential fine-tuning. After
task t the plugin stores θ_t (the blocks' parameters, not the heads); while training task
t+1 it adds (strength / 2) · Σ ‖θ − θ_t‖² over the parameters that are trainable under the
run's regime. Under `head` no block is trainable, so the method is sequential fine-tuning.
It is the "L2" baseline of Kirkpatrick et al. (EWC with the identity as Fisher).
"""
from __future__ import annotations

import torch
from avalanche.core import SupervisedPlugin

from harness.api.subspace import shared_named_parameters

NAME = "l2-anchor"
DEFAULTS = {"strength": 1.0}
DESCRIPTION = "L2 penalty to the previous task's parameters (from-scratch plugin example)"
REFERENCE = "Kirkpatrick et al., PNAS 2017 (the L2 baseline)"


class L2AnchorPlugin(SupervisedPlugin):
    """Adds (strength/2)·‖θ − θ_prev‖² to the loss; θ_prev is refreshed after every task."""

    def __init__(self, strength: float):
        super().__init__()
        self.strength = float(strength)
        self.anchor: dict[str, torch.Tensor] = {}
        self.penalties: list[float] = []  # mean penalty per task, for the record's diagnostics
        self._sum, self._count = 0.0, 0

    def before_backward(self, strategy, **kwargs):
        """Add the penalty to the loss Avalanche is about to back-propagate."""
        params = shared_named_parameters(strategy.model)
        # Only trainable parameters: frozen ones cannot move, so their term is a constant.
        terms = [(p - self.anchor[n]).pow(2).sum() for n, p in params.items()
                 if p.requires_grad and n in self.anchor]
        if not terms:
            return
        penalty = 0.5 * self.strength * torch.stack(terms).sum()
        strategy.loss = strategy.loss + penalty
        self._sum, self._count = self._sum + float(penalty.detach()), self._count + 1

    def after_training_exp(self, strategy, **kwargs):
        """The model after this task becomes the anchor for the next one."""
        self.anchor = {n: p.detach().clone() for n, p in shared_named_parameters(strategy.model).items()}
        self.penalties.append(self._sum / self._count if self._count else 0.0)
        self._sum, self._count = 0.0, 0

    def harness_diagnostics(self):
        """Called by the harness after every task; lands in record["diagnostics"]."""
        return {"l2_anchor_mean_penalty": list(self.penalties)}


def build(ctx, strength: float):
    """Sequential fine-tuning (Avalanche Naive) with the L2 anchor plugin."""
    from avalanche.training.supervised import Naive

    if strength < 0:
        raise ValueError(f"strength must be >= 0, got {strength}")
    return Naive(**ctx.strategy_kwargs(L2AnchorPlugin(strength)))
