"""Sequential fine-tuning (the lower bound) and joint training (the upper bound)."""
from __future__ import annotations

import torch

from ..api.contract import MethodAdapter, dataset_tensors, tag_tensors


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

        def train_dataset_adaptation(self, **kwargs):
            """JointTraining's concatenation, tagged with its tensors: the harness's fast path then
            draws mixed-task minibatches from them (Avalanche's loader where a task has none)."""
            super().train_dataset_adaptation(**kwargs)
            parts = [dataset_tensors(e.dataset) for e in self._seen]
            if all(p is not None for p in parts):
                tag_tensors(self.adapted_dataset, *(torch.cat([p[i] for p in parts]) for i in range(3)))

    return IncrementalJoint(**ctx.strategy_kwargs())


ADAPTERS = (
    MethodAdapter("naive", {}, build_naive, "Sequential fine-tuning (Avalanche Naive)",
                  family="baselines", prefix_cache=True),
    MethodAdapter("joint", {}, build_joint,
                  "Joint training on all tasks seen so far (Avalanche JointTraining); upper bound",
                  family="baselines",
                  version="2"),  # 2: mixed-task minibatches from the harness's seeded tensor batches
)
