"""DER and DER++ (harness/methods/dark_replay.py): the loss by hand and against Avalanche's DER on the
same tensors, the reservoir against a per-example re-run of mammoth's loop, the logits stored at
insertion, the regimes in class-IL, determinism and the memory the record is told about."""
import copy
import dataclasses
import math
import types

import pytest
import torch
from conftest import make_spec
from torch import nn

from harness.api.contract import memory_use
from harness.api.registry import get_registry
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods.dark_replay import DarkExperienceReplay, StreamReservoir, der_loss
from harness.run.engine import run_one

REGIMES = ("head", "last-1", "full", "bitfit", "norm", "lora-r4")


def classil_spec(method: str, regime: str = "full", **hparams):
    """A tiny class-IL run: digits 3 tasks x 2 classes, mlp-bn (BatchNorm: `norm` has parameters), 1 epoch."""
    return make_spec(method=method, regime=regime, scenario="class-il", pretrain="none",
                     dataset=DatasetSpec("digits", 3, 2, "mlp-bn"),
                     hparams={**get_registry()[method].defaults, **hparams},
                     training=TrainingSpec(lr=0.03, momentum=0.0, epochs=1, batch_size=64))


def _ce(row, label):
    return math.log(sum(math.exp(v) for v in row)) - row[label]


def test_der_loss_is_ce_plus_alpha_mse_plus_beta_ce_by_hand():
    out, y = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], [1, 2]
    out1, logits = [[0.5, 0.5, 0.0]], [[1.0, 0.0, 2.0]]
    out2, y2 = [[2.0, 0.0, 1.0], [0.0, 0.0, 0.0]], [0, 2]
    alpha, beta = 0.3, 0.7
    hand = (sum(_ce(r, c) for r, c in zip(out, y)) / 2
            + alpha * ((0.5 - 1.0) ** 2 + 0.5 ** 2 + 2.0 ** 2) / 3
            + beta * sum(_ce(r, c) for r, c in zip(out2, y2)) / 2)
    T = torch.tensor
    loss = der_loss(T(out), T(y), T(out1), T(logits), T(out2), T(y2), alpha=alpha, beta=beta)
    assert loss.item() == pytest.approx(hand, rel=1e-6)
    assert der_loss(T(out), T(y)).item() == pytest.approx(sum(_ce(r, c) for r, c in zip(out, y)) / 2, rel=1e-6)


def test_der_loss_is_avalanches_on_the_same_tensors():
    """Avalanche's DER computes its loss inline in one training iteration: run one on a model without
    BatchNorm (joint and separate forwards agree) with one memory batch serving both terms."""
    from avalanche.training.supervised import DER

    torch.manual_seed(0)
    model = nn.Linear(6, 5)
    x, y, t = torch.randn(4, 6), torch.tensor([0, 1, 1, 0]), torch.zeros(4, dtype=torch.long)
    mx, my, mt, logits = torch.randn(3, 6), torch.tensor([2, 3, 4]), torch.zeros(3, dtype=torch.long), torch.randn(3, 5)
    before = copy.deepcopy(model)
    strategy = DER(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), mem_size=10, batch_size_mem=3,
                   alpha=0.3, beta=0.7, train_mb_size=4, evaluator=None, device="cpu")
    strategy.plugins = []  # no evaluator: the experience below is a stand-in
    strategy.experience = types.SimpleNamespace(task_labels=[0])
    strategy.dataloader, strategy.replay_loader = [[x, y, t]], iter([(mx, my, mt, logits)])
    strategy.model.train()
    strategy.training_epoch()
    with torch.no_grad():
        ours = der_loss(before(x), y, before(mx), logits, before(mx), my, alpha=0.3, beta=0.7)
    assert strategy.loss.item() == pytest.approx(ours.item(), rel=1e-6)


def _mammoth_reservoir(batches, size, seed):
    """mammoth's Buffer.add_data loop, example by example, with our generator's draws (one per example)."""
    generator, seen, slots = torch.Generator().manual_seed(seed), 0, [None] * size
    for batch in batches:
        draws = torch.rand(len(batch), generator=generator, dtype=torch.float64).tolist()
        for value, u in zip(batch, draws):
            index = seen if seen < size else math.floor(u * (seen + 1))
            seen += 1
            if index < size:
                slots[index] = value
    return [s for s in slots if s is not None]


def test_the_reservoir_keeps_mammoths_rows_example_by_example():
    batches = [list(range(i * 7, i * 7 + 7)) for i in range(9)]  # 63 examples into 10 slots
    buffer = StreamReservoir(10, torch.Generator().manual_seed(3))
    for batch in batches:
        v = torch.tensor(batch)
        buffer.add(v.float().unsqueeze(1), v, v % 2, v.float().unsqueeze(1) * 2)
    x, y, t, logits = buffer.rows()
    assert y.tolist() == _mammoth_reservoir(batches, 10, 3)
    assert torch.equal(x.squeeze(1).long(), y) and torch.equal(t, y % 2) and torch.equal(logits.squeeze(1), 2 * x.squeeze(1))
    assert buffer.seen == 63 and len(buffer) == 10


def test_the_reservoir_keeps_each_example_with_equal_probability():
    counts, trials, size = torch.zeros(20), 1000, 5
    generator = torch.Generator().manual_seed(0)
    for _ in range(trials):
        buffer = StreamReservoir(size, generator)
        for start in range(0, 20, 6):
            v = torch.arange(start, min(start + 6, 20))
            buffer.add(v.unsqueeze(1), v, v)
        counts[buffer.rows()[1]] += 1
    share = counts / trials  # each of 20 examples is kept with probability 5/20
    assert (share - 0.25).abs().max() < 0.06, share  # 4 standard deviations


def test_memory_batches_are_drawn_without_replacement_and_capped_by_the_rows():
    buffer = StreamReservoir(8, torch.Generator().manual_seed(0))
    buffer.add(torch.arange(5).float().unsqueeze(1), torch.arange(5), torch.zeros(5, dtype=torch.long))
    x, y, t = buffer.draw(32, torch.Generator().manual_seed(1))
    assert sorted(y.tolist()) == [0, 1, 2, 3, 4]
    assert len(buffer.draw(3, torch.Generator().manual_seed(1))[1]) == 3


def test_stored_logits_are_the_outputs_of_the_training_forward_pass():
    """Buffer large enough for every row: slots fill in stream order, so the first minibatch's rows and
    logits are the first 64 slots; their logits are the untrained model's outputs (a Linear model: the
    training mode does not matter), not outputs after any step."""
    from harness.run.datasets import load_dataset
    from harness.run.streams import split_tasks, to_avalanche

    torch.manual_seed(0)
    tasks = split_tasks(load_dataset("digits"), tuple(range(10)), 5, 2)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    before = copy.deepcopy(model)
    strategy = DarkExperienceReplay(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), alpha=0.3,
                                    beta=0.5, mem_size=1000, batch_size_mem=None, seed=0, train_mb_size=64,
                                    train_epochs=1, device="cpu", evaluator=None)
    strategy.train(to_avalanche(tasks).train_stream[0])
    x, y, _t, logits = strategy.buffer.rows()
    assert len(y) == len(tasks[0].y_train) and sorted(y.tolist()) == sorted(tasks[0].y_train.tolist())
    with torch.no_grad():
        assert torch.allclose(logits[:64], before(x[:64]), atol=1e-6)
        assert not torch.allclose(logits[64:128], before(x[64:128]), atol=1e-3)  # after one step
    assert len(strategy.parts) == 3 and strategy.parts[1:] == [64, 64]  # current + two memory batches (DER++)


@pytest.mark.parametrize("method", ["der", "derpp"])
@pytest.mark.slow
@pytest.mark.parametrize("regime", REGIMES)
def test_runs_in_class_il_under_every_regime(method, regime):
    record = run_one(classil_spec(method, regime), device="cpu")
    assert record.status == "ok", record.error  # the engine's frozen-parameter check passed
    assert len(record.acc_matrix) == 3


def test_the_record_budget_counts_memory_rows_and_der_draws_one_batch_derpp_two():
    plain = run_one(classil_spec("naive"), device="cpu").budget
    der = run_one(classil_spec("der", batch_size_mem=16), device="cpu").budget
    derpp = run_one(classil_spec("derpp", batch_size_mem=16), device="cpu").budget
    steps = plain["steps_per_task"]
    assert der["steps_per_task"] == derpp["steps_per_task"] == steps
    # memory batches from the second minibatch on (the buffer holds the first): 16 rows each
    assert der["samples_seen"] == plain["samples_seen"] + 16 * (sum(steps) - 1)
    assert derpp["samples_seen"] == plain["samples_seen"] + 2 * 16 * (sum(steps) - 1)


@pytest.mark.parametrize("method", ["der", "derpp", "er-ace"])
def test_reruns_give_bitwise_equal_accuracy_matrices(method):
    spec = classil_spec(method)
    a, b = run_one(spec, device="cpu"), run_one(spec, device="cpu")
    assert a.status == b.status == "ok" and a.acc_matrix == b.acc_matrix and a.update_norms == b.update_norms


# a buffer row: x (1x8x8 float32), y, task label (int64), and for DER the logits (6 classes, float32)
@pytest.mark.parametrize("method, mem_size, row", [("derpp", 150, 64 * 4 + 8 + 8 + 6 * 4), ("er-ace", 500, 64 * 4 + 8 + 8)])
def test_memory_reports_the_buffers_rows_and_bytes(method, mem_size, row):
    seen = {}

    def observer(event, t, strategy):
        if event == "after_task":
            use = memory_use(strategy)
            seen[t] = (use.samples, use.bytes, strategy.buffer.seen)

    record = run_one(classil_spec(method, mem_size=mem_size), device="cpu", observer=observer)
    assert record.status == "ok", record.error
    for t, (samples, nbytes, offered) in seen.items():
        assert samples == min(mem_size, offered) and nbytes == samples * row, (t, samples, nbytes)
    assert seen[2][0] == mem_size  # full by the last task


@pytest.mark.parametrize("method, hparams, samples", [
    ("replay", {"mem_size": 40}, [40, 40, 40]),
    ("gem", {"patterns_per_exp": 16, "memory_strength": 0.5}, [16, 32, 48]),
    ("agem", {"patterns_per_exp": 16, "sample_size": 16}, [16, 32, 48]),
])
def test_replay_gem_and_agem_report_their_memories(method, hparams, samples):
    """rehearsal.py's methods state their buffers' rows and bytes (x 1x8x8 float32, y and task label int64)."""
    seen = []

    def observer(event, t, strategy):
        if event == "after_task":
            use = memory_use(strategy)
            seen.append((use.samples, use.bytes))

    record = run_one(classil_spec(method, **hparams), device="cpu", observer=observer)
    assert record.status == "ok", record.error
    assert seen == [(n, n * (64 * 4 + 8 + 8)) for n in samples]


def future_rows_untouched(method: str) -> None:
    """In a class-IL run, the head's rows of classes still to come stay as initialised until their task
    (as tests/test_growing_head.py checks for naive): every loss term covers the seen columns only."""
    heads = []
    spec = dataclasses.replace(classil_spec(method), training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1,
                                                                          batch_size=64))
    record = run_one(spec, device="cpu", observer=lambda event, t, s: heads.append(
        (s.model.heads[0].weight.detach().clone(), s.model.heads[0].bias.detach().clone())))
    assert record.status == "ok", record.error
    (w0, b0), (w1, b1), (w2, b2), (w3, b3) = heads[:4]  # before/after task 1, before/after task 2
    assert torch.equal(w0[2:], w1[2:]) and torch.equal(b0[2:], b1[2:])  # classes of tasks 2, 3: untouched
    assert torch.equal(w2[4:], w3[4:]) and torch.equal(b2[4:], b3[4:])  # task 3's classes: untouched in task 2
    assert not torch.equal(w0[:2], w1[:2]) and not torch.equal(w2[:4], w3[:4])  # the seen classes' rows train


@pytest.mark.parametrize("method", ["der", "derpp"])
def test_der_keeps_the_official_fixed_head_in_class_il(method):
    """DER's cross-entropy and logit MSE cover every column (mammoth): later classes' rows train from task 1."""
    heads = []
    spec = dataclasses.replace(classil_spec(method), training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1,
                                                                          batch_size=64))
    record = run_one(spec, device="cpu", observer=lambda event, t, s: heads.append(
        s.model.heads[0].weight.detach().clone()))
    assert record.status == "ok", record.error
    before, after = heads[:2]  # around task 1
    assert not torch.equal(before[2:], after[2:])  # classes of tasks 2 and 3 pushed down already
