"""iCaRL on the harness's model, checked against Avalanche 0.6's own pieces on identical tensors:
herding picks `_ICaRLPlugin`'s exemplars, the memory shrinks as its `reduce_exemplar_set`, the class
means are its `compute_class_means`, the loss is `ICaRLLossPlugin`'s, the nearest-mean predictions
are `NCMClassifier`'s; and engine runs (class-IL, every regime family, bitwise reruns)."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import make_spec

from harness.api import contract
from harness.api.registry import get_registry
from harness.config.errors import ProtocolError
from harness.config.protocol import parse_protocol
from harness.config.specs import DatasetSpec
from harness.methods.icarl import DistillationLoss, ExemplarMemory, exemplar_means, herding
from harness.methods.prototypes import NearestMeanClassifier
from harness.methods.rehearsal import rows_of
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.fastdata import TensorBatches
from harness.run.models import build_model
from harness.run.streams import split_tasks, to_avalanche

N_TASKS, CPT = 5, 2


@pytest.fixture(scope="module")
def stream():
    tasks = split_tasks(load_dataset("digits"), tuple(range(10)), N_TASKS, CPT, "class-il")
    return tasks, list(to_avalanche(tasks).train_stream)


def _net(seed=0):
    torch.manual_seed(seed)
    return build_model("mlp-bn", (1, 8, 8), 1, N_TASKS * CPT).eval()


def _avalanche_icarl(net, memory_size):
    """Avalanche's _ICaRLPlugin with a stand-in strategy over `net` (inputs seen flat, so no flip)."""
    from avalanche.models import NCMClassifier
    from avalanche.training.supervised.icarl import _ICaRLPlugin

    plugin = _ICaRLPlugin(memory_size, fixed_memory=True)
    model = SimpleNamespace(feature_extractor=lambda x: net.features(x.reshape(-1, 1, 8, 8)),
                            eval_classifier=NCMClassifier(normalize=True))
    plugin.embedding_size = 100

    def strategy(t, exp):
        benchmark = SimpleNamespace(n_classes_per_exp=[CPT] * N_TASKS, classes_order=list(range(N_TASKS * CPT)))
        return SimpleNamespace(experience=SimpleNamespace(dataset=exp.dataset, benchmark=benchmark),
                               clock=SimpleNamespace(train_exp_counter=t), model=model, eval_mb_size=4096,
                               device="cpu")
    return plugin, model, strategy


def _by_rank(x, order):
    return x[order.argsort()]


def test_herding_memory_and_means_are_avalanches(stream):
    tasks, exps = stream
    net = _net()
    plugin, model, strategy = _avalanche_icarl(net, 40)
    ours = ExemplarMemory(40)
    for t in range(3):
        s = strategy(t, exps[t])
        plugin.before_training_exp(s)
        plugin.construct_exemplar_set(s)
        plugin.reduce_exemplar_set(s)
        ours.add_task(net, *rows_of(exps[t].dataset), batch_size=4096)
        m = 40 // (2 * (t + 1))  # ours: 20, 10, 6 per class; Avalanche's ceil: 20, 10, 7
        assert [k[1] for k in ours.classes] == [c for c in range(2 * (t + 1))]
        for i, (key, (x, task)) in enumerate(ours.classes.items()):
            theirs = _by_rank(plugin.x_memory[i], plugin.order[i])  # its picks in herding order
            assert len(x) == m and torch.equal(x, theirs[:m]) and task.eq(key[1] // CPT).all()
            assert plugin.y_memory[i][0] == key[1]
    # the class means: Avalanche's compute_class_means on the same exemplars (flat inputs: no flip)
    plugin.x_memory = [x.flatten(1) for x, _ in ours.classes.values()]
    plugin.y_memory = [[label] * len(x) for (_, label), (x, _) in ours.classes.items()]
    plugin.compute_class_means(strategy(2, exps[2]))
    means = exemplar_means(net, ours, 4096)
    assert means.known[0].tolist() == [True] * 6 + [False] * 4
    for c in range(6):
        assert torch.allclose(means.means[0, c], plugin.class_means[c], atol=1e-6)
    # the nearest-mean-of-exemplars predictions: NCMClassifier's with those means
    x_test = torch.cat([t.x_test for t in tasks])
    ncm = NearestMeanClassifier(net, means.means, means.known)(x_test, 0)
    theirs = model.eval_classifier(net.features(x_test))
    assert torch.allclose(ncm[:, :6], theirs[:, :6], atol=1e-5)
    assert torch.equal(ncm[:, :6].argmax(1), theirs[:, :6].argmax(1)) and ncm[:, 6:].eq(float("-inf")).all()


def test_herding_is_the_official_loop_on_hand_made_features():
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.1]])
    d = F.normalize(f, dim=1)
    mu = d.mean(0)
    first = int((d @ mu).argmax())  # the row closest to the mean
    picks = herding(f, 2).tolist()
    assert picks[0] == first == 2 and picks[1] == int((d @ (2 * mu - d[first])).argmax())
    assert sorted(herding(f, 10).tolist()) == [0, 1, 2, 3]  # at most every row, after at most 1000 steps


def test_the_loss_is_icarl_loss_plugins_on_identical_tensors():
    from avalanche.training.losses import ICaRLLossPlugin

    net, old = _net(0).train(), _net(1)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(4, 6, (16,))
    y[:5] = torch.tensor([0, 1, 2, 3, 1])  # exemplar rows of past classes
    t = y // CPT
    strategy = SimpleNamespace(mb_x=x, mb_task_id=t)
    ours, theirs = DistillationLoss(), ICaRLLossPlugin()
    ours.old_model, ours.old_classes = old, [0, 1, 2, 3]
    theirs.old_model, theirs.old_classes = (lambda inputs: old(inputs, t)), [0, 1, 2, 3]
    ours.before_forward(strategy)
    theirs.before_forward(strategy)
    logits = net(x, t)
    a, b = ours(logits, y), theirs(logits, y)
    assert torch.equal(a, b)
    target = F.one_hot(y, 10).float()
    target[:, :4] = torch.sigmoid(old(x, t))[:, :4]  # by hand: past classes take the old model's sigmoid
    assert torch.allclose(a, F.binary_cross_entropy(torch.sigmoid(logits), target))
    # the growing head: the harness's criterion says 6 classes are seen, the loss covers their columns
    growing = DistillationLoss(columns=SimpleNamespace(seen=6))
    growing.old_model, growing.old_classes = old, [0, 1, 2, 3]
    growing.before_forward(strategy)
    theirs.before_forward(strategy)
    assert torch.equal(growing(logits, y), theirs(logits[:, :6], y))
    growing.before_forward(strategy)  # the loss consumes the old logits: one forward per loss
    assert torch.allclose(growing(logits, y), F.binary_cross_entropy(torch.sigmoid(logits[:, :6]), target[:, :6]))


def test_the_previous_model_is_a_frozen_eval_copy(stream):
    _, exps = stream
    net = _net().train()
    loss = DistillationLoss()
    loss.after_training_exp(SimpleNamespace(model=net, device="cpu", experience=exps[0]))
    assert loss.old_model is not net and not loss.old_model.training and loss.old_classes == [0, 1]
    assert all(torch.equal(a, b) for a, b in zip(loss.old_model.state_dict().values(), net.state_dict().values()))
    assert not any(p.requires_grad for p in loss.old_model.parameters())


def _spec(regime="full", **kw):
    return make_spec(method="icarl", hparams={"mem_size": 40}, scenario="class-il", regime=regime,
                     dataset=DatasetSpec("digits", N_TASKS, CPT, "mlp-bn"), **kw)


def test_a_class_il_run_trains_on_exemplars_evaluates_the_nearest_mean_and_reruns_bitwise(monkeypatch):
    from harness.methods.icarl import ICaRLStrategy

    seen, loaders = [], []
    after = ICaRLStrategy._after_training_exp

    def keep_loader(strategy, **kwargs):  # Avalanche drops strategy.dataloader after a task
        loaders.append((strategy.dataloader, len(strategy.experience.dataset)))
        after(strategy, **kwargs)

    monkeypatch.setattr(ICaRLStrategy, "_after_training_exp", keep_loader)

    def observer(event, t, strategy):
        if event == "after_task":
            evaluated = contract.evaluated_model(strategy)
            use = contract.memory_use(strategy)
            model_bytes = sum(v.numel() * v.element_size() for v in (*strategy.model.parameters(),
                                                                      *strategy.model.buffers()))
            # exemplars (x: 64 floats, y, t), 10 means of 100 floats + their mask, the previous model
            assert use.bytes == use.samples * (64 * 4 + 8 + 8) + 10 * 100 * 4 + 10 + model_bytes
            loader, current = loaders[t]
            seen.append((loader, isinstance(evaluated, NearestMeanClassifier), evaluated.blocks is strategy.model.blocks,
                         use.samples, current))

    a = run_one(_spec(), device="cpu", observer=observer)
    b = run_one(_spec(), device="cpu")
    assert a.status == "ok", a.error
    assert a.acc_matrix == b.acc_matrix and a.acc_matrix_task_aware == b.acc_matrix_task_aware
    memory = [0] + [40 // (2 * t) * 2 * t for t in range(1, N_TASKS)]  # exemplars trained on at task t
    for t, (loader, nme, shared, samples, current) in enumerate(seen):
        assert isinstance(loader, TensorBatches) and loader.mixed and len(loader.y) == current + memory[t]
        assert nme and shared
        assert samples == 40 // (2 * (t + 1)) * 2 * (t + 1)
    assert a.metrics["acc"] > 0.5  # naive's is ~0.1 here (tests run it elsewhere)


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["head", "last-1", "bitfit", "norm", "lora-r4"])
def test_every_regime_family_runs_with_its_frozen_blocks_untouched(regime):
    record = run_one(_spec(regime), device="cpu")  # the engine fails a run whose frozen state changed
    assert record.status == "ok", record.error


def _protocol(scenario):
    return {"name": "p", "version": "1", "scenario": scenario,
            "datasets": [{"name": "digits", "n_tasks": 5, "classes_per_task": 2, "model": "mlp-bn"}],
            "regimes": ["head"], "methods": ["naive", {"name": "icarl", "hparams": {"mem_size": 20}}]}


def test_icarl_is_refused_in_a_task_il_protocol_in_one_line():
    assert parse_protocol(_protocol("class-il"), "p.yaml", get_registry()).methods[1].name == "icarl"
    with pytest.raises(ProtocolError) as err:
        parse_protocol(_protocol("task-il"), "p.yaml", get_registry())
    message = str(err.value)
    assert message.startswith("p.yaml: methods[1].name: icarl is defined in class-il only") and "\n" not in message
    # a task-IL spec that reaches build() anyway fails as a record
    record = run_one(make_spec(method="icarl", hparams={"mem_size": 20}), device="cpu")
    assert record.status == "failed" and "class-il only" in record.error


def test_an_adapter_declares_known_scenarios():
    import dataclasses

    from harness.api.registry import validate_adapter
    from harness.config.errors import RegistryError

    adapter = get_registry()["icarl"]
    with pytest.raises(RegistryError, match="the scenarios of 'icarl' must be a non-empty tuple of task-il, class-il"):
        validate_adapter(dataclasses.replace(adapter, scenarios=("domain-il",)), "x.py")
    assert get_registry()["ncm"].scenarios == ("task-il", "class-il")
