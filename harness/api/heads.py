"""The class-IL head as a growing one: one set of logit columns, of which the seen classes' answer.

A class-IL model has one head over every class of the stream (columns in task order: task t's
classes are columns t*cpt .. (t+1)*cpt - 1). A growing head (Avalanche's IncrementalClassifier) has
units only for the classes seen so far; several official codes get the same effect on a fixed head
by slicing their losses to the seen classes' columns (mammoth's iCaRL `outputs[:, :ac]`, BiC's
`all_cl = range((itera+1)*nb_cl)`). The harness gives that answer by training with the loss below
(ctx.criterion, `strategy._criterion`) and evaluating the argmax over the seen columns, so the rows
of classes still to come are neither trained nor predicted until their task arrives. Methods that
compute their own losses pass them through the criterion (or slice to its `seen`). One family keeps
its official fixed head on purpose: DER/DER++ (mammoth, Avalanche) compute cross-entropy and the
logit MSE over every column, so the stored logits carry the pushed-down scores of classes not yet
seen, and distilling them is what keeps new classes from taking over old data (with the growing
head, DER fell to naive's accuracy: methods/dark_replay.py). ER-ACE follows the growing head, as
Avalanche's ER_ACE on an incremental classifier does.
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
