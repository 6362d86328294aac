"""SLCA (harness/methods/slca.py) against the official code (tests/official/slca.py) on identical tensors, and
short class-IL runs of vit-tiny under last-2 and lora-r4."""
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_spec
from official import slca as official

from harness.api.contract import make_optimizer
from harness.config.pretrain import parse_pretrain
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods.slca import (
    SLCAPlugin,
    align_classifier,
    class_statistics,
    current_task_loss,
    refused_regime,
    split_groups,
)
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.streams import split_tasks

WIDTH, CPT, N_TASKS = 12, 2, 3
OFFICIAL_SGD = TrainingSpec(optimizer="sgd", lr=official.lrate, momentum=0.9, weight_decay=official.weight_decay)


def _vectors(seed=0, rows=40):
    """Per class: float32 features with a class-specific mean and a random correlation (numpy, as extracted)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for c in range(CPT * N_TASKS):
        mix = torch.randn(WIDTH, WIDTH, generator=g) * 0.3
        out[c] = (torch.randn(rows, WIDTH, generator=g) @ mix + torch.randn(WIDTH, generator=g)).numpy()
    return out


def _official_learner(vectors, logit_norm=0.1):
    """The official learner after task N_TASKS - 1 with every class's statistics, fc initialised officially."""
    torch.manual_seed(3)
    fc = official.SimpleContinualLinear(WIDTH, CPT)
    for _ in range(N_TASKS - 1):
        fc.update(CPT)
    learner = official.SLCA(official.Network(torch.nn.Linear(2, 2), fc), vectors, 0, 0, N_TASKS - 1,
                            [CPT] * N_TASKS, WIDTH, logit_norm=logit_norm)
    for t in range(N_TASKS):  # task by task, as incremental_train calls it
        learner._known_classes, learner._total_classes = t * CPT, (t + 1) * CPT
        learner._compute_class_mean(None, check_diff=False, oracle=False)
    return learner


def test_class_statistics_equal_the_official_means_and_covariances():
    vectors = _vectors()
    learner = _official_learner(vectors)
    worst_mean = worst_cov = 0.0
    for c, v in vectors.items():
        mean, cov = class_statistics(torch.from_numpy(v), 1e-4)
        worst_mean = max(worst_mean, float((mean - torch.from_numpy(learner._class_means[c])).abs().max()))
        worst_cov = max(worst_cov, float((cov - learner._class_covs[c]).abs().max()))
    print(f"class means max abs diff {worst_mean:.3g}, covariances {worst_cov:.3g}")
    assert worst_mean < 1e-6 and worst_cov == 0.0


@pytest.mark.parametrize("logit_norm", [0.1, None])
def test_aligned_classifier_equals_the_officials_on_the_same_statistics_and_seed(logit_norm):
    learner = _official_learner(_vectors(), logit_norm)
    head = torch.nn.Linear(WIDTH, CPT * (N_TASKS + 1))  # the harness's head has columns for a task still to come
    with torch.no_grad():
        head.weight[:CPT * N_TASKS] = torch.cat([h[0].weight for h in learner._network.fc.heads])
        head.bias[:CPT * N_TASKS] = torch.cat([h[0].bias for h in learner._network.fc.heads])
    before = head.weight.detach().clone()
    means, covs = torch.from_numpy(learner._class_means), learner._class_covs.clone()
    torch.manual_seed(11)
    learner._stage2_compact_classifier(CPT)
    torch.manual_seed(11)
    steps = align_classifier(head, means, covs, [CPT] * N_TASKS, official.ca_epochs, 256, logit_norm,
                             lambda params: make_optimizer(OFFICIAL_SGD, params))
    theirs_w = torch.cat([h[0].weight for h in learner._network.fc.heads]).detach()
    theirs_b = torch.cat([h[0].bias for h in learner._network.fc.heads]).detach()
    seen = CPT * N_TASKS
    diff = max(float((head.weight[:seen].detach() - theirs_w).abs().max()), float((head.bias[:seen].detach() - theirs_b).abs().max()))
    print(f"aligned classifier (logit_norm {logit_norm}) max abs diff {diff:.3g}")
    assert steps == official.ca_epochs * seen
    assert float((theirs_w - before[:seen]).abs().max()) > 1e-3  # the alignment moved the head
    assert diff < 1e-5


def test_stage_1_loss_and_learning_rates_equal_the_officials():
    torch.manual_seed(0)
    known, total = 4, 6
    logits, y = torch.randn(9, 10), torch.randint(known, total, (9,))
    learner = official.SLCA(None, {}, known, total, 2, [2, 2, 2], WIDTH)
    ours = current_task_loss(logits, y, known, total)
    theirs = learner._run_loss(logits[:, :total], y)
    print(f"stage-1 loss abs diff {float((ours - theirs).abs()):.3g}")
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=0)
    # the param groups: the backbone at bcb_lrscale x the head's lr, both at the protocol's weight decay
    backbone, fc = torch.nn.Linear(4, 4), official.SimpleContinualLinear(4, 2)
    learner._network = official.Network(backbone, fc)
    optimizer, _ = learner._stage1_training(None, None)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.heads = torch.nn.ModuleDict({"b": backbone}), torch.nn.ModuleList([fc])

    mine = make_optimizer(OFFICIAL_SGD, Model().parameters())
    split_groups(mine, Model(), official.lrate, 0.01)
    for a, b in zip(optimizer.param_groups, mine.param_groups, strict=True):
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12) and a["weight_decay"] == b["weight_decay"]
        assert [id(p) for p in a["params"]] == [id(p) for p in b["params"]]
    assert [g["lr"] for g in mine.param_groups] == pytest.approx([1e-4, 1e-2])


def test_head_is_refused_and_trainable_backbones_are_not():
    assert "head" in refused_regime("head")
    assert all(refused_regime(r) is None for r in ("last-2", "full", "lora-r4", "last-2:lora-r4"))


def test_a_protocol_pairing_slca_with_another_family_is_refused_at_load(tmp_path):
    from harness.api.registry import get_registry
    from harness.config.errors import UserError
    from harness.config.protocol import load_protocol

    path = tmp_path / "p.yaml"
    path.write_text("name: slca-test\nversion: '1'\nscenario: class-il\npretrain: none\n"
                    "datasets: [{name: digits, n_tasks: 5, classes_per_task: 2, model: vit-tiny}]\n"
                    "regimes: [last-2, lora-r4, bitfit]\nmethods: [naive, slca]\n")
    with pytest.raises(UserError, match="slca cannot run faithfully under regime 'bitfit'"):
        load_protocol(str(path), get_registry())
    path.write_text(path.read_text().replace("[last-2, lora-r4, bitfit]", "[last-2, lora-r4, last-2:lora-r4]"))
    assert "slca" in [m.name for m in load_protocol(str(path), get_registry()).methods]


def _vit_spec(regime, **hparams):
    recipe = parse_pretrain({"dataset": "same", "holdout": 0.3, "epochs": 2, "lr": 0.05, "batch_size": 64},
                            "p.yaml", Path(".")).for_dataset("digits")
    return make_spec(method="slca", scenario="class-il", regime=regime, pretrain=recipe,
                     dataset=DatasetSpec("digits", 3, 2, "vit-tiny"),
                     hparams={"ca_epochs": 2, "ca_samples_per_class": 32, **hparams},
                     training=TrainingSpec(lr=0.01, momentum=0.9, epochs=1, batch_size=32))


@pytest.mark.parametrize("regime", ["last-2", "lora-r4"])
def test_vit_tiny_runs_are_reproducible_and_keep_the_statistics(regime, monkeypatch, tmp_path):
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    seen = {}

    def observer(event, t, strategy):
        plugin = next(p for p in strategy.plugins if isinstance(p, SLCAPlugin))
        if event == "after_task":
            seen.setdefault("lrs", []).append([g["lr"] for g in strategy.optimizer.param_groups])
            seen["plugin"], seen["model"] = plugin, strategy.model

    spec = _vit_spec(regime)
    a, b = run_one(spec, device="cpu", observer=observer), run_one(spec, device="cpu")
    assert a.status == "ok", a.error
    assert a.acc_matrix == b.acc_matrix and a.diagnostics == b.diagnostics and a.budget == b.budget
    assert seen["lrs"][-1] == pytest.approx([1e-4, 1e-2])
    plugin = seen["plugin"]
    assert plugin.means.shape == (6, 32) and plugin.covs.shape == (6, 32, 32)
    assert a.diagnostics["slca_ca_steps"] == [0, 2 * 4, 2 * 6]  # epochs x classes seen, from task 2 on
    assert a.diagnostics["slca_ca_rows"] == [0, 2 * 4 * 32, 2 * 6 * 32]
    kept = 6 * 32 * 8 + 6 * 32 * 32 * 4 + (6 * 32 + 6) * 4  # float64 means, float32 covariances and aligned head
    assert a.budget["memory_bytes"][-1] == kept
    # the model's own head is stage 1's: the evaluated head differs from it (aligned) on the seen rows
    assert not torch.equal(plugin.aligned.weight, seen["model"].heads[0].weight)


def test_task_il_fails_in_one_line():
    spec = make_spec(method="slca", scenario="task-il", regime="last-1", pretrain="none",
                     dataset=DatasetSpec("digits", 2, 2, "mlp"))
    record = run_one(spec, device="cpu")
    assert record.status == "failed" and "class-IL only" in record.error


def test_class_statistics_are_of_the_task_data_with_the_model_of_that_time():
    """On an MLP under full fine-tuning: each class's stored mean and covariance are those of its training rows'
    features with the model right after its task (recomputed here with plain torch from the captured model)."""
    tasks = split_tasks(load_dataset("digits"), tuple(range(10)), 3, 2, "class-il")
    expected = {}

    def observer(event, t, strategy):
        if event == "after_task":
            seen["plugin"] = next(p for p in strategy.plugins if isinstance(p, SLCAPlugin))
            heads.append(strategy.model.heads[0].weight.detach().clone())
            strategy.model.eval()
            with torch.no_grad():
                f = strategy.model.features(tasks[t].x_train).double()
            for c in tasks[t].y_train.unique().tolist():
                rows = f[tasks[t].y_train == c]
                centred = rows - rows.mean(0)
                expected[c] = (rows.mean(0), centred.T @ centred / (len(rows) - 1) + 1e-4 * torch.eye(f.shape[1]))

    heads = []
    seen = {}
    record = run_one(make_spec(method="slca", scenario="class-il", regime="full", pretrain="none",
                               dataset=DatasetSpec("digits", 3, 2, "mlp"), hparams={"ca_samples_per_class": 16}),
                     device="cpu", observer=observer)
    assert record.status == "ok", record.error
    plugin = seen["plugin"]
    worst_mean = max(float((plugin.means[c] - m).abs().max()) for c, (m, _) in expected.items())
    worst_cov = max(float((plugin.covs[c].double() - v).abs().max()) for c, (_, v) in expected.items())
    assert worst_mean < 1e-5 and worst_cov < 1e-5, (worst_mean, worst_cov)
    # stage 1 trains the current task's head rows only: earlier tasks' rows are as their task left them
    for t in range(1, 3):
        assert torch.equal(heads[t][:2 * t], heads[t - 1][:2 * t])
        assert not torch.equal(heads[t][2 * t:2 * t + 2], heads[t - 1][2 * t:2 * t + 2])
    assert np.isfinite(record.acc_matrix[-1]).all()


def test_stage_1_learning_rates_decay_at_the_official_milestone():
    """epochs 20, lr_decay_at 0.9: both groups at their rates for epochs 0..17, x0.1 at 18 and 19 (MultiStepLR [18])."""
    from types import SimpleNamespace

    plugin = SLCAPlugin(TrainingSpec(lr=0.01), 0.01, 0.9, 0.1, 5, 256, 0.1, None, 1e-4, 2, 0)
    groups = [{"lr": None}, {"lr": None}]
    rates = []
    for epoch in range(20):
        strategy = SimpleNamespace(train_epochs=20, clock=SimpleNamespace(train_exp_epochs=epoch),
                                   optimizer=SimpleNamespace(param_groups=groups))
        plugin.before_training_epoch(strategy)
        rates.append([g["lr"] for g in groups])
    assert rates[:18] == [pytest.approx([1e-4, 1e-2])] * 18 and rates[18:] == [pytest.approx([1e-5, 1e-3])] * 2
