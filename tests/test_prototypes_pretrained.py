"""`simplecil` and `aper` (harness/methods/prototypes.py) against SimpleCIL's and APER's official code
(tests/official/revisitingcil_simplecil.py) on identical tensors, end to end through the engine; their regime
declarations (MethodAdapter.regimes_allowed, refused at protocol load in one line); determinism, budget, compute
and method-owned state."""
from types import SimpleNamespace

import pytest
import torch
from conftest import make_spec
from official import revisitingcil_simplecil as official

from harness.api.registry import get_registry
from harness.config.protocol import ProtocolError, parse_protocol
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods.prototypes import FrozenFeatureStrategy
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.streams import split_tasks

N_TASKS, CPT = 5, 2
ORDER = (3, 1, 4, 0, 5, 9, 2, 6, 8, 7)


def vit_spec(method, regime, n_tasks=N_TASKS, epochs=1, **overrides):
    """A class-IL run on digits with a vit-tiny of the seeded initial weights as its 'pretrained' backbone."""
    overrides = {"pretrain": "none", **overrides}
    return make_spec(method=method, regime=regime, scenario="class-il", class_order=ORDER,
                     dataset=DatasetSpec("digits", n_tasks, CPT, "vit-tiny"),
                     training=TrainingSpec(lr=0.01, momentum=0.9, epochs=epochs, batch_size=32), **overrides)


def run_capturing(spec):
    """The record, and the strategy plus its `harness_state()` after every task."""
    seen = {"states": []}

    def observer(event, t, strategy):
        if event == "after_task":
            seen["strategy"] = strategy
            seen["states"].append({k: v.clone() for k, v in strategy.harness_state().items()})

    record = run_one(spec, device="cpu", observer=observer)
    assert record.status == "ok", record.error
    return record, seen["strategy"], seen["states"]


class Features(torch.nn.Module):
    """A harness model's `features` as the official code's `convnet` (eval mode, as replace_fc sets)."""

    def __init__(self, model):
        super().__init__()
        object.__setattr__(self, "model", model)

    def forward(self, x):
        return self.model.features(x)


def batches(x, y, size=64):
    """The official loaders' `(index, data, label)` minibatches."""
    return [(None, x[s:s + size], y[s:s + size]) for s in range(0, len(x), size)]


def official_prototypes(network, learner, tasks):
    """The official class-incremental loop: grow the cosine head, then replace_fc on each task's training data."""
    for t, task in enumerate(tasks):
        network.update_fc((t + 1) * CPT)
        learner.train_dataset = SimpleNamespace(labels=task.y_train.numpy())
        learner.replace_fc(batches(task.x_train, task.y_train), network, None)
    return network


def digits_tasks(n_tasks=N_TASKS):
    return split_tasks(load_dataset("digits"), ORDER, n_tasks, CPT, "class-il")


def compare(harness_strategy, network, tasks):
    """Max abs differences of the prototypes and of the cosine logits on every task's test data."""
    protos = harness_strategy.classifier.protos
    proto_diff = float((protos - network.fc.weight.data).abs().max())
    evaluated = harness_strategy.harness_eval_model().eval()
    x = torch.cat([t.x_test for t in tasks])
    with torch.no_grad():
        ours, theirs = evaluated(x), network.eval()(x)["logits"]
    return proto_diff, float((ours - theirs).abs().max())


def test_simplecil_equals_the_official_replace_fc_and_cosine_linear_end_to_end():
    record, strategy, _ = run_capturing(vit_spec("simplecil", "head"))
    tasks = digits_tasks()
    model = strategy.model.eval()
    width = model.features(tasks[0].x_train[:1]).shape[1]
    network = official.SimpleVitNet(Features(model), width)
    official_prototypes(network, official.Learner(network), tasks)
    proto_diff, logit_diff = compare(strategy, network, tasks)
    print(f"simplecil: prototypes max abs diff {proto_diff:.3g}, cosine logits {logit_diff:.3g}")
    assert proto_diff < 1e-5 and logit_diff < 1e-5
    # the prototypes are plain means (the cosine classifier normalises), not unit-norm means as ncm's
    assert not torch.allclose(strategy.classifier.protos.norm(dim=1), torch.ones(N_TASKS * CPT))


def test_aper_equals_the_official_dual_branch_prototypes_end_to_end():
    """APER under bitfit: task 1 trains the biases and the head, then prototypes of [pretrained, adapted]."""
    record, strategy, _ = run_capturing(vit_spec("aper", "bitfit", n_tasks=3))
    tasks = digits_tasks(3)
    pretrained, adapted = strategy.pretrained_branch, strategy.model.eval()
    probe = tasks[0].x_test[:8]
    assert not torch.allclose(pretrained.features(probe), adapted.features(probe))  # task 1 adapted something
    width = 2 * adapted.features(probe).shape[1]
    network = official.MultiBranchForward(torch.nn.ModuleList([Features(pretrained), Features(adapted)]), width)
    official_prototypes(network, official.AperLearner(network), tasks)
    proto_diff, logit_diff = compare(strategy, network, tasks)
    print(f"aper: prototypes max abs diff {proto_diff:.3g}, cosine logits {logit_diff:.3g}")
    assert proto_diff < 1e-5 and logit_diff < 1e-5
    budget = record.budget
    assert budget["steps_per_task"][0] > 0 and budget["steps_per_task"][1:] == [0, 0]
    assert budget["compute"]["backward_per_task"][1:] == [0, 0]
    # after task 1: two feature passes (pretrained and adapted branch) over each task's training rows
    rows = [len(t.y_train) for t in tasks]
    assert budget["compute"]["forward_per_task"][1:] == [2 * n for n in rows[1:]]
    assert budget["epochs_per_stage"] == [[1, 1], [1], [1]]
    branch_bytes = sum(t.numel() * t.element_size() for t in (*pretrained.parameters(), *pretrained.buffers()))
    assert budget["memory_bytes"][-1] > branch_bytes  # the kept pretrained branch counts, with the prototypes


def test_aper_under_a_prompt_regime_keeps_a_pretrained_branch_without_prompts():
    record, strategy, _ = run_capturing(vit_spec("aper", "prompt-l2", n_tasks=2))
    from harness.api.prompts import prompt_parameters
    from harness.run.models import build_model

    assert prompt_parameters(strategy.model) and not prompt_parameters(strategy.pretrained_branch)
    torch.manual_seed(0)  # the run's initial weights (make_spec seed 0; pretrain none): the branch is that model
    fresh = build_model("vit-tiny", (1, 8, 8), 1, 2 * CPT)
    x = digits_tasks(2)[0].x_test[:16]
    assert torch.equal(fresh.eval().features(x), strategy.pretrained_branch.features(x))


def test_simplecil_is_deterministic_forward_only_and_its_old_prototypes_never_move():
    spec = vit_spec("simplecil", "head")
    a, strategy, states = run_capturing(spec)
    b = run_one(spec, device="cpu")
    assert a.acc_matrix == b.acc_matrix and a.budget == b.budget and a.metrics == b.metrics
    compute = a.budget["compute"]
    rows = [len(t.y_train) for t in digits_tasks()]
    assert a.budget["optimizer_steps"] == 0 and compute["backward_samples"] == 0
    assert compute["forward_per_task"] == rows  # one feature pass over each task's training data
    # method-owned state: the prototypes of the classes seen so far, rows of old classes unchanged (drift 0)
    shapes = [s["prototypes.class_means"].shape[0] for s in states]
    assert shapes == [CPT * (t + 1) for t in range(N_TASKS)]
    for before, after in zip(states, states[1:]):
        old = before["prototypes.class_means"]
        assert torch.equal(after["prototypes.class_means"][: len(old)], old)
    assert isinstance(strategy, FrozenFeatureStrategy) and not any(p.grad is not None for p in strategy.model.parameters())


# -- regimes: declared, refused at load in one line ------------------------------------------------------

def protocol(method, regimes, methods_regimes=None):
    entry = {"name": method} if methods_regimes is None else {"name": method, "regimes": methods_regimes}
    return {"name": "p", "version": "1", "scenario": "class-il",
            "datasets": [{"name": "digits", "n_tasks": 5, "classes_per_task": 2, "model": "vit-tiny"}],
            "regimes": regimes, "methods": [entry], "training": {"epochs": 1}}


@pytest.mark.parametrize("method,regime,allowed", [
    ("simplecil", "last-2", "allowed: head"), ("simplecil", "full", "allowed: head"),
    ("simplecil", "lora-r4", "allowed: families depth"),
    ("aper", "head", "that is simplecil"), ("aper", "last-2", "or full (APER-Finetune)"),
    ("ranpac", "full", "allowed: head, or a first-session PEFT adaptation"),
    ("ranpac", "last-1", "allowed: head, or a first-session PEFT adaptation")])
def test_a_refused_pair_is_one_line_naming_method_regime_and_what_is_allowed(method, regime, allowed):
    with pytest.raises(ProtocolError) as caught:
        parse_protocol(protocol(method, [regime]), "p.yaml", get_registry())
    message = str(caught.value)
    assert "\n" not in message and f"{method} cannot run faithfully under regime {regime!r}" in message
    assert allowed in message and message.startswith("p.yaml: methods[0]")


@pytest.mark.parametrize("method,regimes", [
    ("simplecil", ["head"]), ("aper", ["bitfit", "norm", "lora-r4", "last-2:lora-r4", "prompt-l4", "full"]),
    ("ranpac", ["head", "bitfit", "norm", "lora-r1", "prompt-l4", "prompt-deep-l2"])])
def test_the_faithful_regimes_load(method, regimes):
    p = parse_protocol(protocol(method, regimes), "p.yaml", get_registry())
    assert all(p.methods[0].runs_under(r) for r in regimes)


def test_a_method_entry_may_list_only_its_regimes_of_a_wider_protocol():
    p = parse_protocol(protocol("simplecil", ["head", "last-2", "full"], ["head"]), "p.yaml", get_registry())
    assert [r for r in p.regimes if p.methods[0].runs_under(r)] == ["head"]


def test_the_cli_refuses_simplecil_under_last_2_in_one_line_with_exit_code_2(cli, tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(protocol("simplecil", ["head", "last-2"])))
    code, out, err = cli("run", "--protocol", path, "--results", tmp_path / "res", "--dry-run", "--no-mlflow")
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "simplecil cannot run faithfully under regime 'last-2'" in lines[0], err


def test_a_submitted_file_declares_regimes_allowed_and_a_bad_declaration_is_refused(tmp_path):
    from harness.api.registry import RegistryError, adapters_from_module, load_module_file

    good = tmp_path / "frozen.py"
    good.write_text("from avalanche.training.supervised import Naive\nNAME = 'frozen'\nDEFAULTS = {}\n"
                    "def REGIMES_ALLOWED(regime):\n    return None if regime == 'head' else 'frozen only; allowed: head'\n"
                    "def build(ctx):\n    return Naive(**ctx.strategy_kwargs())\n")
    registry = get_registry((str(good),))
    with pytest.raises(ProtocolError, match="frozen cannot run faithfully under regime 'full': frozen only; "
                                            "allowed: head"):
        parse_protocol(protocol("frozen", ["head", "full"]), "p.yaml", registry)
    assert parse_protocol(protocol("frozen", ["head"]), "p.yaml", registry).methods[0].runs_under("head")
    bad = tmp_path / "bad.py"
    bad.write_text("NAME = 'bad'\nDEFAULTS = {}\nREGIMES_ALLOWED = 'head'\ndef build(ctx):\n    pass\n")
    with pytest.raises(RegistryError, match="REGIMES_ALLOWED of 'bad' must be a function"):
        adapters_from_module(load_module_file(bad), str(bad))


def test_class_il_only():
    with pytest.raises(ProtocolError, match="simplecil is defined in class-il only"):
        parse_protocol({**protocol("simplecil", ["head"]), "scenario": "task-il"}, "p.yaml", get_registry())


def test_aper_under_first_task_pretraining_is_simplecil_on_the_task_1_model():
    """No pretrained weights: both branches are the task-1 model, whose duplicated features have its cosine
    similarities; no branch of random initial weights is kept (the review's case)."""
    aper, strategy, _ = run_capturing(vit_spec("aper", "lora-r4", n_tasks=3, pretrain="first-task"))
    simplecil, _, _ = run_capturing(vit_spec("simplecil", "head", n_tasks=3, pretrain="first-task"))
    assert getattr(strategy, "pretrained_branch", None) is None and aper.budget["memory_bytes"][-1] > 0
    # task 1 trains everything in both; the prototypes then come from the same task-1 model
    assert aper.acc_matrix == simplecil.acc_matrix
