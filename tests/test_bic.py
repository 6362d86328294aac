"""BiC (harness/methods/bic.py) against Avalanche's BiCPlugin on identical tensors, and in runs."""
from types import SimpleNamespace

import pytest
import torch
from conftest import make_spec, run_recording_memory

from harness.api.registry import get_registry
from harness.config.specs import DatasetSpec
from harness.methods.bic import BiasCorrected, TensorBiCPlugin, distillation_loss, split_memory
from harness.methods.rehearsal import rows_of
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.streams import split_tasks, to_avalanche


def _stream():
    return list(to_avalanche(split_tasks(load_dataset("digits"), tuple(range(10)), 5, 2, "class-il")).train_stream)


def _rows(dataset):
    items = [dataset[i] for i in range(len(dataset))]
    return (torch.stack([torch.as_tensor(i[0]) for i in items]), torch.tensor([int(i[1]) for i in items]),
            torch.tensor([int(i[-1]) for i in items]))


def _same(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b))


def _fill_both(n_tasks, mem=31, val_percentage=0.2):
    """Avalanche's BiCPlugin and ours through the memory updates of `n_tasks` tasks, same RNG draws;
    checks at every task that both hold the same rows."""
    from avalanche.training.plugins import BiCPlugin

    theirs = BiCPlugin(mem_size=mem, val_percentage=val_percentage)
    ours = TensorBiCPlugin(mem, int(val_percentage * mem))  # Avalanche's memory: mem rows + the validation rows
    stream = _stream()
    for i, exp in enumerate(stream[:n_tasks]):
        agent = SimpleNamespace(experience=SimpleNamespace(dataset=exp.dataset, current_experience=i),
                                clock=SimpleNamespace(train_exp_counter=i), device="cpu")
        state = torch.get_rng_state()
        theirs.before_train_dataset_adaptation(agent)  # the validation split
        their_training = _rows(agent.experience.dataset)
        theirs.storage_policy.update(agent)  # after training: the stage-1 memory
        torch.set_rng_state(state)
        x, y, t = rows_of(exp.dataset)
        keep = ours.split(x, y, t, i)
        ours.reservoir.add(*ours.train_rows)
        assert _same(ours.train_rows, their_training) and _same((x[keep], y[keep], t[keep]), their_training)
        their_val = _rows(torch.utils.data.ConcatDataset([b.buffer for b in theirs.val_buffer.values()]))
        assert _same(ours.val.rows(), their_val)
        assert _same(ours.reservoir.rows(), _rows(theirs.storage_policy.buffer))
    return theirs, ours, stream


def test_memories_hold_avalanches_rows():
    theirs, ours, _ = _fill_both(3)
    assert len(ours.val) == 6 and len(ours.reservoir.rows()[1]) == 31
    assert ours.class_to_tasks == theirs.class_to_tasks


class OldModel(torch.nn.Module):
    """A single-head model Avalanche's plugin can call without task labels."""

    def __init__(self, n_classes=6):
        super().__init__()
        self.fc = torch.nn.Linear(64, n_classes)

    def forward(self, x, task_labels=None):
        return self.fc(x.flatten(1))


def _distillation_case(plugin):
    from avalanche.models.bic_model import BiasLayer

    torch.manual_seed(3)
    plugin.class_to_tasks = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    plugin.model_old = OldModel()
    plugin.bias_layer = BiasLayer([2, 3])
    with torch.no_grad():
        plugin.bias_layer.alpha.fill_(1.3)
        plugin.bias_layer.beta.fill_(-0.4)
    x = torch.randn(9, 1, 8, 8)
    return SimpleNamespace(mb_x=x, mb_output=torch.randn(9, 6), mb_task_id=torch.full((9,), 2),
                           loss=torch.tensor(0.7), experience=SimpleNamespace(current_experience=2))


def test_distillation_is_avalanches_with_the_softmax_over_classes(monkeypatch):
    from avalanche.training.plugins import BiCPlugin

    theirs, ours = BiCPlugin(), TensorBiCPlugin(10, 2, T=2.0)
    a, b = _distillation_case(theirs), _distillation_case(ours)
    ours.before_backward(b)
    theirs.before_backward(a)
    assert not torch.allclose(a.loss, b.loss)  # Avalanche's softmax runs over the batch (dim=0)
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda z, dim=None: softmax(z, dim=1))
    a = _distillation_case(theirs)
    theirs.before_backward(a)
    assert torch.allclose(a.loss, b.loss, atol=1e-6, rtol=0)
    # by hand: λ = 4 old / 6 classes; old logits of classes 2, 3 corrected by 1.3·z - 0.4
    old = ours.model_old(b.mb_x)
    old[:, 2:4] = 1.3 * old[:, 2:4] - 0.4
    soft = softmax(old[:, :4] / 2, dim=1)
    hand = -(soft * torch.log_softmax(b.mb_output[:, :4] / 2, dim=1)).sum(1).mean()
    assert torch.allclose(b.loss, (1 - 4 / 6) * 0.7 + 4 / 6 * hand, atol=1e-6)
    assert torch.allclose(distillation_loss(b.mb_output[:, :4], old[:, :4], 2.0), hand, atol=1e-6)


def test_fixed_lambda_adds_the_distillation():
    ours = TensorBiCPlugin(10, 2, lamb=0.5)
    b = _distillation_case(ours)
    ours.before_backward(b)
    with torch.no_grad():
        old = ours.bias_layer(ours.model_old(b.mb_x))
    assert torch.allclose(b.loss, 0.7 + 0.5 * distillation_loss(b.mb_output[:, :4], old[:, :4], 2.0))


def test_bias_layer_trains_as_avalanches_on_the_validation_memory(monkeypatch):
    from avalanche.benchmarks.utils.classification_dataset import (
        _make_taskaware_tensor_classification_dataset as tensor_dataset,
    )
    from avalanche.training.plugins import bic as avalanche_bic

    # Avalanche 0.6 passes MultiStepLR a `verbose` this torch no longer takes (one more reason for our own)
    scheduler = torch.optim.lr_scheduler.MultiStepLR
    monkeypatch.setattr(avalanche_bic, "MultiStepLR", lambda opt, milestones, gamma, verbose=False:
                        scheduler(opt, milestones, gamma))

    theirs, ours, stream = _fill_both(3, mem=60, val_percentage=0.5)  # 30 validation rows, 5 per class
    torch.manual_seed(0)
    model = OldModel()
    x, y, _ = rows_of(stream[2].dataset)
    agent = SimpleNamespace(model=model, adapted_dataset=tensor_dataset(x, y, task_labels=2), train_mb_size=64,
                            device="cpu")
    theirs.bias_correction_step(agent)  # 200 epochs of one batch: the order within it does not matter
    ours.bias_correction(model, 2, 64, "cpu")
    assert ours.bias_layer.clss.tolist() == theirs.bias_layer.clss.tolist() == [4, 5]
    assert abs(float(ours.bias_layer.alpha) - float(theirs.bias_layer.alpha)) < 1e-4
    assert abs(float(ours.bias_layer.beta) - float(theirs.bias_layer.beta)) < 1e-4
    assert float(ours.bias_layer.alpha) != 1.0  # it trained
    # the evaluated model is the model with the bias layer on its logits (Avalanche's after_eval_forward)
    ours.model = model
    evaluated = ours.harness_eval_model()
    theirs.is_first_experience, theirs.bias_layer = False, ours.bias_layer
    view = SimpleNamespace(mb_output=model(x[:7]))
    theirs.after_eval_forward(view)
    assert isinstance(evaluated, BiasCorrected) and evaluated.model is model
    assert torch.equal(evaluated(x[:7], 2), view.mb_output)


def test_the_bias_layer_trains_on_the_seen_classes_columns_only():
    """A head with columns of classes still to come (10 columns, 6 classes seen): stage 2's loss covers the seen
    columns, so the bias layer is the one trained on a 6-column model with the same first rows (the official
    code's `all_cl = range((itera+1)*nb_cl)`), whatever the other columns hold."""
    from harness.methods.bic import STAGE_STREAM
    from harness.methods.rehearsal import memory_generator

    _, ours, _ = _fill_both(3, mem=60, val_percentage=0.5)
    torch.manual_seed(0)
    six, ten = OldModel(6), OldModel(10)
    with torch.no_grad():
        ten.fc.weight[:6], ten.fc.bias[:6] = six.fc.weight, six.fc.bias
        ten.fc.bias[6:] = 50.0  # unseen columns that would dominate a softmax over every column
    fitted = []
    for model in (six, ten):
        ours.stage_generator = memory_generator(0, STAGE_STREAM)
        ours.bias_correction(model, 2, 64, "cpu")
        fitted.append((float(ours.bias_layer.alpha), float(ours.bias_layer.beta)))
    assert ours.seen_classes() == 6 and fitted[0] == fitted[1] and fitted[0][0] != 1.0


def test_mem_size_is_the_whole_memory():
    assert split_memory(200, 0.1) == (180, 20)
    with pytest.raises(ValueError, match="validation"):
        split_memory(5, 0.1)


def _spec(regime="full", scenario="class-il", **hparams):
    defaults = dict(get_registry()["bic"].defaults, stage_2_epochs=20)
    return make_spec(method="bic", scenario=scenario, regime=regime, pretrain="none",
                     dataset=DatasetSpec("digits", 5, 2, "mlp-bn"), hparams={**defaults, **hparams})


def test_a_class_il_run_is_deterministic_and_counts_its_memory():
    spec = _spec(mem_size=100)
    a, memory = run_recording_memory(spec)
    b = run_one(spec, device="cpu")
    assert a.status == "ok", a.error
    assert a.acc_matrix == b.acc_matrix and a.diagnostics == b.diagnostics
    assert a.diagnostics["bic_alpha"][0] is None and all(v is not None for v in a.diagnostics["bic_alpha"][1:])
    # stage 2's work, outside the training loop's budget: ceil(10 validation rows / batch) steps per epoch
    # over stage_2_epochs, and one forward pass over the validation rows, from task 2 on
    per_epoch = -(-10 // spec.training.batch_size)
    assert a.diagnostics["bic_stage_2_steps"] == [0] + [per_epoch * spec.hparams.get("stage_2_epochs", 200)] * 4
    assert a.diagnostics["bic_stage_2_rows"] == [0, 10, 10, 10, 10]
    assert [m.samples for m in memory] == [100] * 5  # 90 stage-1 rows + 10 validation rows
    assert [len(m.tensors[1]) for m in memory] == [90] * 5  # the stage-1 memory's labels come first
    params = sum(p.numel() * 4 for p in get_model_params(spec))
    assert memory[-1].bytes > params  # the old model's copy is counted


def test_reporting_the_memory_has_no_side_effect_and_counts_what_is_kept():
    """harness_memory reports the tensors kept (the sampler's, of which the reservoir's groups are views; each
    class's validation rows) without copying them: calling it twice changes nothing."""
    checked = []

    def observer(event, t, strategy):
        if event != "after_task":
            return
        plugin = next(p for p in strategy.plugins if isinstance(p, TensorBiCPlugin))
        groups = [tuple(group) for group in plugin.reservoir.groups]
        first, second = plugin.harness_memory(), plugin.harness_memory()
        assert all(a is b for a, b in zip(first.tensors, second.tensors)) and first.samples == second.samples
        assert all(a is b for old, new in zip(groups, plugin.reservoir.groups) for a, b in zip(old, new))
        sampler = plugin.sampler
        assert first.tensors[:3] == (sampler.x, sampler.y, sampler.t)
        storage = sampler.x.untyped_storage().data_ptr()
        assert all(group[0].untyped_storage().data_ptr() == storage for group in plugin.reservoir.groups)
        val = [v for group in plugin.val.groups.values() if len(group) for v in group.rows]
        assert all(a is b for a, b in zip(first.tensors[3:3 + len(val)], val))
        checked.append(t)

    record = run_one(_spec(mem_size=100, stage_2_epochs=2), device="cpu", observer=observer)
    assert record.status == "ok", record.error
    assert checked == [0, 1, 2, 3, 4]


def get_model_params(spec):
    from harness.run.engine import build_run_model

    return list(build_run_model(spec, (1, 8, 8)).parameters())


def test_task_il_fails_in_one_line():
    record = run_one(_spec(scenario="task-il"), device="cpu")
    assert record.status == "failed" and "class-IL only" in record.error


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["head", "last-1", "full", "bitfit", "norm", "lora-r4"])
def test_every_regime_family_runs_with_frozen_blocks_untouched(regime):
    record = run_one(_spec(regime=regime, mem_size=100), device="cpu")
    assert record.status == "ok", record.error  # the engine fails a run whose frozen state changed


@pytest.mark.slow
def test_every_regime_family_runs_under_first_task_pretraining():
    for regime in ("last-1", "lora-r4"):
        spec = make_spec(method="bic", scenario="class-il", regime=regime, pretrain="first-task",
                         dataset=DatasetSpec("digits", 5, 2, "mlp-bn"),
                         hparams=dict(get_registry()["bic"].defaults, stage_2_epochs=20))
        record = run_one(spec, device="cpu")
        assert record.status == "ok", record.error
