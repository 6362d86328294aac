"""GDumb (harness/methods/gdumb.py): Avalanche's buffer over tensors, the in-place reset, runs."""
from types import SimpleNamespace

import pytest
import torch
from conftest import make_spec, run_recording_memory

from harness.api.registry import get_registry
from harness.config.specs import DatasetSpec
from harness.methods.gdumb import ClassBalancedReservoir, GDumbPlugin, InitialState, row_keys
from harness.methods.rehearsal import rows_of
from harness.run.datasets import load_dataset
from harness.run.models import build_model
from harness.run.regimes import apply_regime, inject_adapters
from harness.run.streams import split_tasks, to_avalanche


def _rows(dataset):
    items = [dataset[i] for i in range(len(dataset))]
    return (torch.stack([torch.as_tensor(i[0]) for i in items]), torch.tensor([int(i[1]) for i in items]),
            torch.tensor([int(i[-1]) for i in items]))


def test_buffer_holds_avalanches_rows_in_its_order():
    from avalanche.training.plugins import GDumbPlugin as AvalancheGDumb

    stream = list(to_avalanche(split_tasks(load_dataset("digits"), tuple(range(10)), 5, 2, "class-il")).train_stream)
    theirs, ours = AvalancheGDumb(mem_size=37), GDumbPlugin(37, "class-il", first_task=False)
    # the first experience again at the end: its classes' reservoirs take more rows (Avalanche's update path)
    for exp in stream[:4] + stream[:1]:
        agent = SimpleNamespace(experience=exp)
        state = torch.get_rng_state()
        theirs.after_train_dataset_adaptation(agent)  # buffer update; the strategy then trains on the buffer
        torch.set_rng_state(state)
        x, y, t = ours.training_rows(exp.dataset, "cpu")
        tx, ty, tt = _rows(agent.adapted_dataset)
        assert torch.equal(x, tx) and torch.equal(y, ty) and torch.equal(t, tt)
        assert [len(g) for g in ours.buffer.groups.values()] == [len(g.buffer) for g in
                                                                 theirs.storage_policy.buffer_groups.values()]
    assert len(ours.buffer) == 37 and sorted(ours.buffer.groups) == list(range(8))


def test_task_il_balances_over_task_and_label():
    tasks = split_tasks(load_dataset("digits"), tuple(range(10)), 5, 2, "task-il")
    y, t = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1])
    assert row_keys(y, t, "task-il") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    buffer = ClassBalancedReservoir(40)
    for exp in list(to_avalanche(tasks).train_stream)[:2]:
        x, y, t = rows_of(exp.dataset)
        buffer.update(x, y, t, row_keys(y, t, "task-il"))
    assert [len(g) for g in buffer.groups.values()] == [10, 10, 10, 10]


def _model(regime):
    model = inject_adapters(build_model("mlp-bn", (1, 8, 8), n_heads=1, head_classes=10), regime)
    apply_regime(model, regime)
    return model


def _perturb(model):
    with torch.no_grad():
        for v in [*model.parameters(), *model.buffers()]:
            v.add_(1)


@pytest.mark.parametrize("regime", ["head", "last-1", "bitfit", "norm", "lora-r4", "full"])
def test_reset_restores_what_trains_and_leaves_the_frozen_alone(regime):
    model = _model(regime)
    initial = {k: v.clone() for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()}
    state = InitialState(model, final_from=0)
    _perturb(model)
    state.reset(model, 0)
    frozen = set(contract_frozen(model))
    for name, value in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items():
        if name in frozen:
            assert torch.equal(value, initial[name] + 1), name  # untouched
        else:
            assert torch.equal(value, initial[name]), name  # back to the start
    assert set(state.tensors) == set(model.state_dict()) - frozen  # only what trains is kept


def contract_frozen(model):
    from harness.run.regimes import frozen_state

    return frozen_state(model)


def test_first_task_pretraining_keeps_task_one_in_the_frozen_blocks():
    model = _model("full")  # task 1 trains everything
    start = {k: v.clone() for k, v in model.state_dict().items()}
    state = InitialState(model, final_from=1)
    state.reset(model, 0)
    _perturb(model)  # what task 1 trained
    apply_regime(model, "last-1")  # the regime from task 2 on
    state.reset(model, 1)
    after = model.state_dict()
    assert torch.equal(after["heads.0.weight"], start["heads.0.weight"])
    assert torch.equal(after["blocks.fc4.0.weight"], start["blocks.fc4.0.weight"])  # the trained block restarts
    assert torch.equal(after["blocks.fc1.1.weight"], start["blocks.fc1.1.weight"] + 1)  # frozen: task 1's
    assert "blocks.fc1.1.weight" not in state.tensors and "blocks.fc4.0.weight" in state.tensors


def _spec(regime="full", scenario="class-il", pretrain="none", **hparams):
    return make_spec(method="gdumb", scenario=scenario, regime=regime, pretrain=pretrain,
                     dataset=DatasetSpec("digits", 5, 2, "mlp-bn"),
                     hparams={**get_registry()["gdumb"].defaults, **hparams})


def test_a_run_trains_on_the_memory_only_and_is_deterministic():
    from harness.run.engine import run_one

    spec = _spec(mem_size=60)
    a, memory = run_recording_memory(spec)
    b = run_one(spec, device="cpu")
    assert a.status == "ok", a.error
    assert a.acc_matrix == b.acc_matrix
    assert [m.samples for m in memory] == [60] * 5
    # each task: 2 epochs over the 60 memory rows (batches of 32: 4 steps)
    assert a.budget["samples_per_task"] == [120] * 5 and a.budget["steps_per_task"] == [4] * 5
    task_il = run_one(_spec(scenario="task-il", mem_size=60), device="cpu")
    assert task_il.status == "ok", task_il.error


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["head", "last-1", "full", "bitfit", "norm", "lora-r4"])
@pytest.mark.parametrize("pretrain", ["none", "first-task"])
def test_every_regime_family_runs_with_frozen_blocks_untouched(regime, pretrain):
    from harness.run.engine import run_one

    record = run_one(_spec(regime=regime, pretrain=pretrain, mem_size=60), device="cpu")
    assert record.status == "ok", record.error  # the engine fails a run whose frozen state changed
