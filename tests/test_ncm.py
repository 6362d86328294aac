"""`ncm`: class means of each task's training features (Avalanche's compute_class_means, and by hand),
nearest-mean predictions (Avalanche's NCMClassifier with the same means), task-IL heads, engine runs."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import make_spec

from harness.api import contract
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods.prototypes import NCMPlugin, NearestMeanClassifier
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.streams import split_tasks, to_avalanche

N_TASKS, CPT = 5, 2


def _stream(scenario):
    tasks = split_tasks(load_dataset("digits"), tuple(range(10)), N_TASKS, CPT, scenario)
    return tasks, list(to_avalanche(tasks).train_stream)


def _fitted(scenario):
    """An NCMPlugin after every task of the stream, on one fixed random mlp-bn (eval mode)."""
    torch.manual_seed(0)
    heads = N_TASKS if scenario == "task-il" else 1
    net = build_model("mlp-bn", (1, 8, 8), heads, CPT if heads > 1 else N_TASKS * CPT).eval()
    tasks, exps = _stream(scenario)
    plugin = NCMPlugin()
    for exp in exps:
        plugin.after_training_exp(SimpleNamespace(model=net, experience=exp, device="cpu", eval_mb_size=97))
    return net, tasks, exps, plugin


def test_means_are_avalanches_compute_class_means_and_a_hand_computation():
    from avalanche.training.plugins.update_ncm import compute_class_means

    net, tasks, exps, plugin = _fitted("class-il")
    assert not net.training  # its mode is put back
    wrapper = SimpleNamespace(feature_extractor=net.features, eval=net.eval, train=lambda: None)
    for task, exp in zip(tasks, exps):
        theirs = compute_class_means(wrapper, exp.dataset, 64, normalize=True, device="cpu")
        for label in task.y_train.unique().tolist():
            ours = plugin.means.means[0, label]
            f = net.features(task.x_train[task.y_train == label]).detach()
            by_hand = (f / f.norm(dim=1, keepdim=True)).mean(0)
            assert torch.allclose(ours, theirs[label], atol=1e-6)
            assert torch.allclose(ours, by_hand / by_hand.norm(), atol=1e-6)
    assert plugin.means.known.all() and contract.memory_use(plugin).samples == 0


def test_predictions_are_ncm_classifiers_with_the_same_means():
    from avalanche.models import NCMClassifier

    net, tasks, _, plugin = _fitted("class-il")
    reference = NCMClassifier(normalize=True)
    reference.replace_class_means_dict({c: plugin.means.means[0, c] for c in range(N_TASKS * CPT)})
    evaluated = plugin.harness_eval_model()
    assert isinstance(evaluated, NearestMeanClassifier) and evaluated.blocks is net.blocks
    x = torch.cat([t.x_test for t in tasks])
    ours, theirs = evaluated(x, 3), reference(net.features(x))
    assert torch.allclose(ours, theirs, atol=1e-6) and torch.equal(ours.argmax(1), theirs.argmax(1))


def test_classes_without_a_mean_are_never_predicted():
    net, tasks, exps, _ = _fitted("class-il")
    plugin = NCMPlugin()
    plugin.after_training_exp(SimpleNamespace(model=net, experience=exps[0], device="cpu", eval_mb_size=97))
    logits = plugin.harness_eval_model()(tasks[3].x_test, 0)
    assert logits[:, 2:].eq(float("-inf")).all() and logits.argmax(1).lt(2).all()


def test_task_il_means_are_per_task_head_and_a_task_sees_its_own():
    from avalanche.models import NCMClassifier

    net, tasks, _, plugin = _fitted("task-il")
    assert plugin.means.means.shape[:2] == (N_TASKS, CPT) and plugin.means.known.all()
    evaluated = plugin.harness_eval_model()
    x = tasks[2].x_test
    reference = NCMClassifier(normalize=True)
    reference.replace_class_means_dict({c: plugin.means.means[2, c] for c in range(CPT)})
    ours = evaluated(x, 2)
    assert ours.shape == (len(x), CPT) and torch.allclose(ours, reference(net.features(x)), atol=1e-6)
    mixed = torch.tensor([2, 4] * (len(x) // 2) + [2] * (len(x) % 2))  # per-row task labels
    rows = torch.cat([evaluated(x[i:i + 1], int(t)) for i, t in enumerate(mixed)])
    assert torch.allclose(evaluated(x, mixed), rows, atol=1e-6)


def _spec(regime="full", **kw):
    return make_spec(method="ncm", scenario="class-il", regime=regime,
                     dataset=DatasetSpec("digits", N_TASKS, CPT, "mlp-bn"), **kw)


def test_a_frozen_backbone_keeps_old_means_exact_and_reruns_are_bitwise():
    """Regime head without pre-training: the features never change, so the stored means are those of
    the final model (SimpleCIL's classifier); the run is deterministic."""
    seen = {}

    def observer(event, t, strategy):
        if event == "after_task" and t == N_TASKS - 1:
            seen["model"] = strategy.model
            seen["plugin"] = next(p for p in strategy.plugins if isinstance(p, NCMPlugin))

    spec = _spec("head", pretrain="none")
    a, b = run_one(spec, device="cpu", observer=observer), run_one(spec, device="cpu")
    assert a.status == "ok", a.error
    assert a.acc_matrix == b.acc_matrix and a.acc_matrix_task_aware == b.acc_matrix_task_aware
    model, plugin = seen["model"], seen["plugin"]
    tasks, _ = _stream("class-il")
    model.eval()
    for task in tasks:
        for label in task.y_train.unique().tolist():
            f = F.normalize(model.features(task.x_train[task.y_train == label]).detach(), dim=1).mean(0)
            assert torch.allclose(plugin.means.means[0, label], f / f.norm(), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["last-1", "full", "bitfit", "norm", "lora-r4"])
def test_every_regime_family_runs_with_its_frozen_blocks_untouched(regime):
    # lora-r4 at this lr: naive's training itself diverges (a NaN loss), as it does for `naive`
    record = run_one(_spec(regime, training=TrainingSpec(lr=0.01, momentum=0.9, epochs=2, batch_size=32)),
                     device="cpu")
    assert record.status == "ok", record.error


def test_dead_features_give_zero_means_and_the_lowest_known_class_not_nan():
    from harness.methods.prototypes import unit_mean

    assert torch.equal(unit_mean(torch.zeros(3, 4)), torch.zeros(4))
    f = torch.tensor([[3.0, 4.0], [6.0, 8.0]])
    assert torch.equal(unit_mean(f), torch.tensor([0.6, 0.8]))

    class Dead(torch.nn.Module):  # a backbone whose features are all zero
        blocks = torch.nn.ModuleDict()

        def features(self, x):
            return torch.zeros(len(x), 2)

    means = torch.tensor([[[0.0, 0.0], [0.6, 0.8], [1.0, 0.0], [0.0, 0.0]]])
    logits = NearestMeanClassifier(Dead(), means, torch.tensor([[False, True, True, False]]))(torch.ones(3, 1), 0)
    assert not logits.isnan().any() and logits.argmax(1).eq(1).all()
