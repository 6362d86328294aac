"""Class-IL's growing head: the loss and the argmax cover the seen classes only (harness/api/heads.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import make_spec

from harness.api.heads import SeenClassesLoss
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.run.engine import run_one
from harness.run.evaluation import class_il_accuracies


def test_the_loss_is_cross_entropy_over_the_seen_columns_and_leaves_the_others_without_gradient():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 10, generator=g, requires_grad=True)
    y = torch.tensor([0, 3, 1, 2, 3, 0])
    loss = SeenClassesLoss()
    loss.seen = 4
    value = loss(logits, y)
    by_hand = -torch.log_softmax(logits.detach()[:, :4], dim=1)[torch.arange(6), y].mean()
    assert torch.allclose(value, by_hand)
    value.backward()
    assert bool((logits.grad[:, 4:] == 0).all()) and bool((logits.grad[:, :4] != 0).any())
    loss.seen = None  # no seen classes set: every column, as CrossEntropyLoss
    assert torch.allclose(loss(logits.detach(), y), F.cross_entropy(logits.detach(), y))


class Fixed(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x, task):
        return self.logits[x.long().view(-1)]


def test_the_class_il_argmax_runs_over_the_seen_classes_only():
    # rows: the true class wins among seen columns 0..3, but an unseen column (8) is larger in row 0
    logits = torch.tensor([[0.0, 2.0, 0.0, 0.0, 0, 0, 0, 0, 9.0, 0], [3.0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    x, y = torch.tensor([0.0, 1.0]), torch.tensor([1, 0])
    every = class_il_accuracies(Fixed(logits), x, y, 0, (0, 2), 8, "cpu")
    seen = class_il_accuracies(Fixed(logits), x, y, 0, (0, 2), 8, "cpu", seen=4)
    assert every == (0.5, 1.0) and seen == (1.0, 1.0)


def test_rows_of_classes_still_to_come_stay_untrained_in_a_class_il_run():
    spec = make_spec(scenario="class-il", dataset=DatasetSpec("digits", 3, 2, "mlp"), regime="full",
                     pretrain="none", training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1))
    heads = []
    rec = run_one(spec, device="cpu", observer=lambda event, t, s: heads.append(
        (event, t, s.model.heads[0].weight.detach().clone(), s.model.heads[0].bias.detach().clone())))
    assert rec.ok, rec.error
    # the initial row is the head as task 1 starts: later tasks' classes cannot be answered, so class-IL
    # FWT is 0 by construction (their task-aware row still measures them)
    assert rec.init_acc[1:] == [0.0, 0.0] and rec.metrics["fwt"] == 0.0
    assert min(rec.init_acc_task_aware[1:]) > 0.0
    (_, _, w0, b0), (_, _, w1, b1) = heads[0], heads[1]  # before and after task 1
    assert torch.equal(w0[2:], w1[2:]) and torch.equal(b0[2:], b1[2:])  # classes of tasks 2, 3: untouched
    assert not torch.equal(w0[:2], w1[:2])  # task 1's classes trained
    last_before, last_after = heads[-2], heads[-1]
    assert not torch.equal(last_before[2][4:], last_after[2][4:])  # task 3's rows train in task 3
