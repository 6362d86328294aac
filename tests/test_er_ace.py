"""ER-ACE (harness/methods/er_ace.py): the mask and the asymmetric loss over the seen columns by hand and
against Avalanche's ACECriterion, the future classes' head rows untrained, the regimes in class-IL,
determinism and the memory."""
import math

import pytest
import torch
from test_dark_replay import REGIMES, classil_spec, future_rows_untouched

from harness.api.contract import memory_use
from harness.api.heads import SeenClassesLoss
from harness.methods.er_ace import ace_loss, ace_mask
from harness.run.engine import run_one


def _ce(row, label, keep=None):
    cols = range(len(row)) if keep is None else keep
    return math.log(sum(math.exp(row[c]) for c in cols)) - row[label]


def test_the_mask_keeps_the_present_classes():
    assert ace_mask(10, torch.tensor([2, 3])).nonzero().flatten().tolist() == [2, 3]
    assert ace_mask(6, torch.tensor([5, 1])).nonzero().flatten().tolist() == [1, 5]


def _seen(n):
    criterion = SeenClassesLoss()
    criterion.seen = n
    return criterion


def test_the_asymmetric_loss_by_hand():
    """Columns 0..3 seen (4 is a class still to come): the current batch over its present classes {2, 3},
    the memory batch over the seen columns; the unseen column takes no part."""
    out = [[1.0, 2.0, 0.5, -1.0, 0.0], [0.0, -1.0, 3.0, 1.0, 2.0]]
    y, mem, y_mem = [2, 3], [[0.5, 0.0, 1.0, 2.0, -2.0]], [0]
    hand = sum(_ce(r, c, [2, 3]) for r, c in zip(out, y)) / 2 + _ce(mem[0], 0, [0, 1, 2, 3])
    T = torch.tensor
    loss = ace_loss(T(out), T(y), True, T(mem), T(y_mem), criterion=_seen(4))
    assert loss.item() == pytest.approx(hand, rel=1e-6)
    other = [r[:4] + [9.0] for r in out], [mem[0][:4] + [-9.0]]  # another unseen column: the same loss
    assert torch.equal(loss, ace_loss(T(other[0]), T(y), True, T(other[1]), T(y_mem), criterion=_seen(4)))
    unmasked = sum(_ce(r, c, range(4)) for r, c in zip(out, y)) / 2  # the first task: CE over the seen, no memory
    assert ace_loss(T(out), T(y), False, criterion=_seen(4)).item() == pytest.approx(unmasked, rel=1e-6)
    every = sum(_ce(r, c) for r, c in zip(out, y)) / 2  # task-IL's plain cross-entropy: every column
    assert ace_loss(T(out), T(y), False).item() == pytest.approx(every, rel=1e-6)


def test_the_loss_is_twice_avalanches_ace_criterion_over_the_seen_columns():
    """Avalanche masks the current batch to its present classes, as ours, and averages the two terms where
    ours sums them: on the seen columns the two agree up to the factor 2."""
    from avalanche.training.regularization import ACECriterion

    torch.manual_seed(0)
    out, mem = torch.randn(6, 10), torch.randn(4, 10)
    y, y_mem = torch.tensor([6, 7, 7, 6, 7, 6]), torch.tensor([0, 3, 5, 1])
    ours = ace_loss(out, y, True, mem, y_mem, criterion=_seen(8))
    theirs = ACECriterion()(out[:, :8], y, mem[:, :8], y_mem)
    assert ours.item() == pytest.approx(2 * theirs.item(), rel=1e-6)


def test_rows_of_classes_still_to_come_stay_untrained_in_a_class_il_run():
    future_rows_untouched("er-ace")


@pytest.mark.slow
@pytest.mark.parametrize("regime", REGIMES)
def test_runs_in_class_il_under_every_regime(regime):
    record = run_one(classil_spec("er-ace", regime), device="cpu")
    assert record.status == "ok", record.error  # the engine's frozen-parameter check passed
    assert len(record.acc_matrix) == 3


def test_memory_batches_start_with_the_second_task():
    plain = run_one(classil_spec("naive"), device="cpu").budget
    ace = run_one(classil_spec("er-ace", batch_size_mem=16), device="cpu").budget
    steps = plain["steps_per_task"]
    assert ace["steps_per_task"] == steps
    assert ace["samples_per_task"][0] == plain["samples_per_task"][0]
    assert ace["samples_per_task"][1:] == [p + 16 * s for p, s in zip(plain["samples_per_task"][1:], steps[1:])]


def test_the_buffer_fills_then_stays_full():
    seen = {}
    record = run_one(classil_spec("er-ace", mem_size=500), device="cpu",
                     observer=lambda event, t, s: seen.setdefault(t, memory_use(s).samples) if event == "after_task"
                     else None)
    assert record.status == "ok", record.error
    assert seen[0] < 500 == seen[2]  # filling, then full (rows and bytes: tests/test_dark_replay.py)
