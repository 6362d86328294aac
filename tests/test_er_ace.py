"""ER-ACE (harness/methods/er_ace.py): the mask and the asymmetric loss by hand and against Avalanche's
ACECriterion where the two definitions meet, the regimes in class-IL, determinism and the memory."""
import math

import pytest
import torch
from test_dark_replay import REGIMES, classil_spec

from harness.api.contract import memory_use
from harness.methods.er_ace import ace_loss, ace_mask
from harness.run.engine import run_one


def _ce(row, label, keep=None):
    cols = range(len(row)) if keep is None else keep
    return math.log(sum(math.exp(row[c]) for c in cols)) - row[label]


def test_the_mask_keeps_the_present_classes_and_those_from_the_highest_seen_on():
    keep = ace_mask(10, torch.tensor([2, 3]), torch.tensor([0, 1, 2, 3]))
    assert keep.nonzero().flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 9]  # 0, 1: seen, absent from the batch
    keep = ace_mask(10, torch.tensor([3]), torch.tensor([0, 1, 2, 3, 4, 5]))
    assert keep.nonzero().flatten().tolist() == [3, 5, 6, 7, 8, 9]  # 2, 4: not in this batch


def test_the_asymmetric_loss_by_hand():
    out = [[1.0, 2.0, 0.5, -1.0, 0.0], [0.0, -1.0, 3.0, 1.0, 2.0]]
    y, seen = [2, 3], [0, 1, 2, 3]
    mem, y_mem = [[0.5, 0.0, 1.0, 2.0, -2.0]], [0]
    keep = [2, 3, 4]  # present {2, 3} and from max(seen) = 3 on
    hand = sum(_ce(r, c, keep) for r, c in zip(out, y)) / 2 + _ce(mem[0], 0)
    T = torch.tensor
    assert ace_loss(T(out), T(y), T(seen), True, T(mem), T(y_mem)).item() == pytest.approx(hand, rel=1e-6)
    unmasked = sum(_ce(r, c) for r, c in zip(out, y)) / 2  # the first task: plain CE, no memory yet
    assert ace_loss(T(out), T(y), T(seen), False).item() == pytest.approx(unmasked, rel=1e-6)


def test_the_loss_is_twice_avalanches_ace_criterion_where_the_definitions_meet():
    """Avalanche masks the current batch to its present classes and averages the two terms; ours also keeps
    the classes from the highest seen on and sums them: on a batch holding the last class they agree up to
    the factor 2."""
    from avalanche.training.regularization import ACECriterion

    torch.manual_seed(0)
    out, mem = torch.randn(6, 8), torch.randn(4, 8)
    y, y_mem = torch.tensor([6, 7, 7, 6, 7, 6]), torch.tensor([0, 3, 5, 1])
    ours = ace_loss(out, y, torch.arange(8), True, mem, y_mem)
    theirs = ACECriterion()(out, y, mem, y_mem)
    assert ours.item() == pytest.approx(2 * theirs.item(), rel=1e-6)


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


def test_reruns_give_bitwise_equal_accuracy_matrices():
    spec = classil_spec("er-ace")
    a, b = run_one(spec, device="cpu"), run_one(spec, device="cpu")
    assert a.status == b.status == "ok" and a.acc_matrix == b.acc_matrix and a.update_norms == b.update_norms


def test_memory_reports_the_buffers_rows_and_bytes():
    seen = {}

    def observer(event, t, strategy):
        if event == "after_task":
            use = memory_use(strategy)
            seen[t] = (use.samples, use.bytes, strategy.buffer.seen, strategy.seen_classes.tolist())

    record = run_one(classil_spec("er-ace", mem_size=500), device="cpu", observer=observer)
    assert record.status == "ok", record.error
    row = 64 * 4 + 8 + 8  # x (1x8x8 float32), y, task label (int64): no logits
    for t, (samples, nbytes, offered, classes) in seen.items():
        assert samples == min(500, offered) and nbytes == samples * row, (t, samples, nbytes)
        assert classes == list(range(2 * t + 2))
    assert seen[0][0] < 500 == seen[2][0]  # filling, then full
