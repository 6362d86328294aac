"""Every method on the harness's tensor path, checked against Avalanche's own route.

GPM and BECAME sample the same rows by tensor indexing as by per-sample dataset access:
their records must be bitwise those of the per-sample path. Replay, A-GEM and joint
training draw their batches differently from Avalanche's loaders (a new implementation
version each): the tests check that the data they train on is Avalanche's (the same buffer,
the same memory rows, the same concatenation) and that the batches are built as documented.
"""
import random

import pytest
import torch
from conftest import make_spec

from harness.api.contract import dataset_tensors, tag_tensors
from harness.api.registry import get_registry
from harness.config.specs import DatasetSpec
from harness.methods import rehearsal
from harness.methods.gpm import dataset_batches
from harness.methods.rehearsal import MemorySampler, MixedBatches, TensorAGEMPlugin, rows_of
from harness.run import streams
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.fastdata import TensorBatches, batch_generator
from harness.run.streams import split_tasks, to_avalanche


def _tasks():
    data = load_dataset("digits")
    return split_tasks(data, tuple(range(10)), 5, 2)


def _rows(dataset):
    """Every item of an Avalanche dataset, collated by hand (the per-sample route)."""
    items = [dataset[i] for i in range(len(dataset))]
    return (torch.stack([torch.as_tensor(i[0]) for i in items]), torch.tensor([int(i[1]) for i in items]),
            torch.tensor([int(i[-1]) for i in items]))


def _same_record(a, b):
    return (a.acc_matrix == b.acc_matrix and a.init_acc == b.init_acc and a.update_norms == b.update_norms
            and a.diagnostics == b.diagnostics and a.budget == b.budget)


def test_every_experience_carries_its_own_rows_as_tensors():
    tasks = _tasks()
    for task, exp in zip(tasks, to_avalanche(tasks).train_stream):
        x, y, t = dataset_tensors(exp.dataset)
        hx, hy, ht = _rows(exp.dataset)
        assert torch.equal(x, hx) and torch.equal(y, hy) and torch.equal(t, ht)
        assert set(t.tolist()) == {task.index}


def test_a_derived_dataset_is_not_mistaken_for_the_tagged_one():
    exp = to_avalanche(_tasks()).train_stream[1]
    n = len(exp.dataset)
    assert dataset_tensors(exp.dataset.subset(list(reversed(range(n))))) is None  # same length, other rows
    assert dataset_tensors(exp.dataset.train()) is None
    assert dataset_tensors(exp.dataset) is not None


def test_sampled_batches_equal_the_per_sample_route():
    exp = to_avalanche(_tasks()).train_stream[2]
    idx = torch.tensor([0, 3, 4, 9, 50, 51, 200])
    fast = list(dataset_batches(exp.dataset, idx, 3, "cpu"))
    untagged = exp.dataset.subset(range(len(exp.dataset)))  # same rows, no tensors attached
    slow = list(dataset_batches(untagged, idx, 3, "cpu"))
    assert len(fast) == len(slow) == 3
    for (fx, ft), (sx, st) in zip(fast, slow):
        assert torch.equal(fx, sx) and torch.equal(ft, st) and fx.dtype == sx.dtype


@pytest.mark.slow
@pytest.mark.parametrize("method, model, regime", [("gpm", "mlp", "last-1"), ("became", "small-cnn", "last-2")])
def test_gpm_and_became_records_are_bitwise_those_of_the_per_sample_path(monkeypatch, method, model, regime):
    torch.set_num_threads(1)
    spec = make_spec(method=method, regime=regime, dataset=DatasetSpec("digits", 5, 2, model),
                     hparams=dict(get_registry()[method].defaults))
    fast = run_one(spec, device="cpu")
    monkeypatch.setattr(streams, "tag_tensors", lambda dataset, *tensors: dataset)  # no tensors: per sample
    slow = run_one(spec, device="cpu")
    assert fast.status == slow.status == "ok", (fast.error, slow.error)
    assert _same_record(fast, slow)


def test_the_memory_stream_is_a_fresh_permutation_per_pass_and_batches_stay_full():
    x = torch.arange(10).float().unsqueeze(1)
    sampler = MemorySampler(x, torch.arange(10), torch.arange(10) % 3, torch.Generator().manual_seed(0))
    drawn = torch.cat([sampler.take(4)[1] for _ in range(5)])  # 20 rows: exactly two passes
    assert sorted(drawn[:10].tolist()) == list(range(10)) and sorted(drawn[10:].tolist()) == list(range(10))
    assert drawn[:10].tolist() != drawn[10:].tolist()  # reshuffled
    xb, yb, tb = sampler.take(7)
    assert len(yb) == 7 and torch.equal(xb.squeeze(1).long(), yb) and torch.equal(tb, yb % 3)


def test_mixed_batches_follow_each_minibatch_with_as_many_memory_rows():
    tasks = _tasks()
    loader = TensorBatches(tasks[1].x_train, tasks[1].y_train, 1, 32, batch_generator(0), "cpu")
    memory = MemorySampler(tasks[0].x_train[:50], tasks[0].y_train[:50], torch.zeros(50, dtype=torch.long),
                           torch.Generator().manual_seed(1))
    batches = list(MixedBatches(loader, memory, 32))
    assert len(batches) == len(loader)
    for _x, y, t in batches[:-1]:
        assert len(y) == 64 and t[:32].eq(1).all() and t[32:].eq(0).all()
    memory_rows = torch.cat([x[32:] for x, _, _ in batches[:-1]])
    known = {tuple(r.flatten().tolist()) for r in tasks[0].x_train[:50]}
    assert all(tuple(r.flatten().tolist()) in known for r in memory_rows)


def test_replay_buffer_is_avalanches_and_its_memory_rows_are_the_buffers():
    from avalanche.training.storage_policy import ExperienceBalancedBuffer

    tasks = _tasks()
    stream = to_avalanche(tasks).train_stream
    plugin = rehearsal.TensorReplayPlugin(mem_size=31, seed=0)  # 31: uneven shares
    reference = ExperienceBalancedBuffer(max_size=31, adaptive_size=True)

    class Agent:
        device = "cpu"

    for exp in list(stream)[:3]:
        Agent.experience = exp
        state = torch.get_rng_state()
        plugin.after_training_exp(Agent())
        torch.set_rng_state(state)  # the reference draws the same reservoir weights
        reference.post_adapt(Agent(), exp)
        x, y, t = _rows(reference.buffer)
        assert torch.equal(plugin.sampler.x, x) and torch.equal(plugin.sampler.y, y)
        assert torch.equal(plugin.sampler.t, t)
        assert [len(g[1]) for g in plugin.reservoir.groups] == [len(g.buffer) for g in reference.buffer_groups.values()]
    assert len(plugin.sampler) == 31 and sorted(set(plugin.sampler.t.tolist())) == [0, 1, 2]


def test_agem_memory_is_the_rows_avalanche_would_keep():
    from avalanche.training.plugins import AGEMPlugin

    exp = to_avalanche(_tasks()).train_stream[0]
    ours, theirs = TensorAGEMPlugin(16, 8, seed=0), AGEMPlugin(16, 8)
    random.seed(5)
    ours.update_memory(exp.dataset)
    random.seed(5)
    theirs.update_memory(exp.dataset)
    x, y, t = _rows(theirs.buffers[0])
    assert torch.equal(ours.samplers[0].x, x) and torch.equal(ours.samplers[0].y, y)
    assert torch.equal(ours.samplers[0].t, t)


def test_agem_reference_batch_takes_an_equal_share_of_every_task_memory():
    stream = to_avalanche(_tasks()).train_stream
    plugin = TensorAGEMPlugin(20, 9, seed=0)
    for exp in list(stream)[:3]:
        plugin.update_memory(exp.dataset)
    x, y, t = plugin.sample_from_memory()
    assert t.tolist() == [0] * 3 + [1] * 3 + [2] * 3 and len(x) == len(y) == 9


@pytest.mark.slow
def test_joint_trains_on_avalanches_concatenation_in_mixed_task_batches():
    seen = {}

    def observer(event, t, strategy):
        if event == "after_task" and t == 2:
            seen["loader"], seen["data"] = strategy.dataloader, strategy.adapted_dataset

    record = run_one(make_spec(method="joint"), device="cpu", observer=observer)
    assert record.status == "ok", record.error
    loader = seen["loader"]
    assert isinstance(loader, TensorBatches) and loader.mixed
    x, y, t = _rows(seen["data"])  # JointTraining's concatenation, read sample by sample
    assert torch.equal(loader.x, x) and torch.equal(loader.y, y) and torch.equal(loader.t, t)
    assert sorted(set(t.tolist())) == [0, 1, 2]
    assert record.budget["samples_per_task"][2] == 2 * len(y)  # 2 epochs over tasks 1..3


@pytest.mark.slow
def test_replay_runs_mix_memory_into_every_batch_from_task_two_on():
    spec = make_spec(method="replay", hparams={"mem_size": 40})
    plain = run_one(make_spec(), device="cpu")
    replay = run_one(spec, device="cpu")
    assert replay.status == plain.status == "ok"
    steps, samples = replay.budget["steps_per_task"], replay.budget["samples_per_task"]
    assert steps == plain.budget["steps_per_task"]  # an epoch is a pass over the current task
    assert samples[0] == plain.budget["samples_per_task"][0]
    assert all(s == p + 32 * n for s, p, n in zip(samples[1:], plain.budget["samples_per_task"][1:], steps[1:]))


@pytest.mark.slow
def test_runs_are_deterministic_on_the_tensor_paths():
    for method in ("replay", "agem", "joint"):
        spec = make_spec(method=method, hparams=dict(get_registry()[method].defaults))
        a, b = run_one(spec, device="cpu"), run_one(spec, device="cpu")
        assert a.status == "ok" and a.acc_matrix == b.acc_matrix and a.update_norms == b.update_norms


def test_rows_of_a_tagged_dataset_equal_its_items():
    tasks = _tasks()
    ds = to_avalanche(tasks).train_stream[3].dataset
    fast = rows_of(ds, [5, 1, 7])
    slow = rows_of(ds.subset(range(len(ds))), [5, 1, 7])
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    with pytest.raises(ValueError, match="3/3/3 rows for a dataset of"):
        tag_tensors(ds, *fast)
