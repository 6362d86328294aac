"""Sequential fine-tuning (the lower bound) and joint training (the upper bound)."""
from __future__ import annotations

from .contract import MethodAdapter


def build_naive(ctx):
    """Plain sequential fine-tuning."""
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs())


def build_joint(ctx):
    """Joint training on every task seen so far, re-fitted after each task."""
    from avalanche.training.supervised import JointTraining

    class IncrementalJoint(JointTraining):
        """JointTraining trains once on a whole stream; the harness measures an accuracy
        matrix, so after task t we fit jointly on tasks 1..t, continuing from the model."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._seen = []

        def train(self, experiences, eval_streams=None, **kwargs):
            self._seen.append(experiences)
            self._is_fitted = False
            return super().train(list(self._seen), eval_streams=[], **kwargs)

    return IncrementalJoint(**ctx.strategy_kwargs())


ADAPTERS = (
    MethodAdapter("naive", {}, build_naive, "Sequential fine-tuning (Avalanche Naive)",
                  family="baselines", prefix_cache=True),
    MethodAdapter("joint", {}, build_joint,
                  "Joint training on all tasks seen so far (Avalanche JointTraining); upper bound",
                  family="baselines"),
)
