"""ER-ACE: experience replay with asymmetric cross-entropy (Caccia et al., "New Insights on Reducing
Abrupt Representation Change in Online Continual Learning", ICLR 2022).

Follows the official code (aimagelab/mammoth models/er_ace.py, the authors' ER-ACE as ported there;
its buffer utils/buffer.py):
- a reservoir buffer over every training example seen (x, y, task label), each minibatch added after
  the optimizer step (the reservoir of harness.methods.dark_replay, without logits);
- current batch: cross-entropy over its logits with every class masked (set to -1e9) except the
  classes present in the batch (`mask[:, present] = 1`), from the second task on (the first task
  trains unmasked, mammoth's default `task_free=False`);
- from the second task on: + cross-entropy of a memory batch (min(batch_size_mem, rows) rows without
  replacement), in its own forward pass; the two terms are summed.
Both cross-entropies go through the run's criterion (`self._criterion`, ctx.criterion): in class-IL
the loss over the columns of the classes seen so far (the harness's growing head, harness/api/heads.py),
in task-IL plain cross-entropy; so the rows of classes still to come are never trained, and the mask
applies within the seen columns. mammoth also unmasks every column from the highest label seen so far
on (`mask[:, seen_so_far.max():] = 1`): with its fixed head those are the future classes' columns
(and the highest seen one), which the softmax of the current batch pushes down. A growing head has no
future columns (their units do not exist yet), so that line has nothing to keep here and is dropped:
the current batch's softmax runs over its present classes, as Avalanche's `ACECriterion` masks it.
In task-IL too (labels are each task's own, 0..cpt-1, where that line only kept the last class unmasked).
Not reproduced: mammoth's default cosine classifier (`use_custom_classifier`), which replaces the
network's classifier: the harness's head is the trained linear head of every method.

Avalanche 0.6's `ER_ACE` runs under the harness (every regime, frozen checks pass; measured), but it
is a different adaptation ("adapted to non-online scenario", its docstring): a class-balanced buffer
updated with the whole current task *before* training on it (so memory batches hold current-task
rows), the current batch masked to its present classes only, and the mean of the two terms; it also
collates memory batches through per-sample datasets (train time 1.4-2.9x replay's on digits, mlp-bn, 6 regimes). Its
`ACECriterion` (over the seen columns) is half our loss (the mean of the two terms, ours their sum):
tests/test_er_ace.py checks that, and the mask and the seen columns by hand.
"""
from __future__ import annotations

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F

from ..api.contract import MethodAdapter, Range
from .dark_replay import SegmentedReplay

# Seed offsets of the generators (distinct from replay's, A-GEM's and DER's streams).
RESERVOIR_STREAM, SAMPLE_STREAM = 43, 47
MASKED = -1e9  # the official code's fill value for masked logits


def ace_mask(n_classes: int, present: torch.Tensor) -> torch.Tensor:
    """Columns the current batch's loss keeps: the classes present in it."""
    keep = torch.zeros(n_classes, dtype=torch.bool, device=present.device)
    keep[present] = True
    return keep


def ace_loss(out, y, masked: bool, out_memory=None, y_memory=None, criterion=F.cross_entropy) -> torch.Tensor:
    """criterion(current logits, masked to the present classes when `masked`) + criterion(memory logits);
    `criterion`: the run's (class-IL: over the seen columns, within which the mask then applies)."""
    if masked:
        out = out.masked_fill(~ace_mask(out.shape[1], y.unique()), MASKED)
    loss = criterion(out, y)
    if out_memory is not None:
        loss = loss + criterion(out_memory, y_memory)
    return loss


class ERACE(SegmentedReplay):
    """ER with the asymmetric cross-entropy on a reservoir buffer."""

    def __init__(self, **kwargs):
        super().__init__(streams=(RESERVOIR_STREAM, SAMPLE_STREAM), **kwargs)

    def later_task(self) -> bool:
        """From the second task on (mammoth's `current_task > 0`)."""
        return self.clock.train_exp_counter > 0

    def memory_batches(self) -> list[tuple]:
        if not len(self.buffer) or not self.later_task():
            return []
        return [self.buffer.draw(self.batch_size_mem, self.sampler)]

    def criterion(self):
        if not self.is_training:
            return super().criterion()
        outs, ys = self.mb_output.split(self.parts), self.mb_y.split(self.parts)
        memory = (outs[1], ys[1]) if len(outs) > 1 else (None, None)
        return ace_loss(outs[0], ys[0], self.later_task(), *memory, criterion=self._criterion)

    def _after_update(self, **kwargs):
        x, y, t, _ = self.current()
        self.buffer.add(x, y, t)
        super()._after_update(**kwargs)


def build_er_ace(ctx, mem_size: int, batch_size_mem):
    """ER-ACE on a reservoir buffer of (x, y) over the whole stream."""
    return ERACE(mem_size=int(mem_size), batch_size_mem=batch_size_mem, seed=ctx.seed, **ctx.strategy_kwargs())


# Defaults: buffer 200 (mammoth's tuned ER-ACE config, models/config/er_ace.yaml: seq-cifar10, 200; as DER's
# and replay's here); memory batch = the training batch (mammoth main.py sets minibatch_size = batch_size).
ADAPTERS = (
    MethodAdapter("er-ace", {"mem_size": 200, "batch_size_mem": None}, build_er_ace,
                  "ER with asymmetric cross-entropy (reservoir buffer)", "Caccia et al., ICLR 2022",
                  family="rehearsal", hparam_types={"batch_size_mem": (int, None)},
                  hparam_ranges={"mem_size": Range(low=1), "batch_size_mem": Range(low=1)},
                  version="2"),  # 2: CE through the run's criterion (class-IL: seen columns); mask = present classes
)
