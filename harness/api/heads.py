"""The class-IL head as a growing one: one set of logit columns, of which the seen classes' answer.

A class-IL model has one head over every class of the stream (columns in task order: task t's
classes are columns t*cpt .. (t+1)*cpt - 1). A growing head (Avalanche's IncrementalClassifier,
iCaRL's, DER's) has units only for the classes seen so far: the harness gives the same answer by
training with the loss below and evaluating the argmax over the seen columns, so the rows of
classes still to come are neither trained nor predicted until their task arrives.
"""
from __future__ import annotations

import torch


class SeenClassesLoss(torch.nn.CrossEntropyLoss):
    """Cross-entropy over the logit columns of the classes seen so far (`seen`; None: every column).

    The harness sets `seen` before each task; the columns of classes not seen yet get no gradient,
    as units a growing head has not added yet.
    """

    def __init__(self):
        super().__init__()
        self.seen: int | None = None

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of `target` over `logits[:, :seen]`."""
        if self.seen is not None:
            logits = logits[:, :self.seen]
        return super().forward(logits, target)
