"""Continual evaluation of merging methods (issue 29): a mid-task point evaluates the model the method would
output if training stopped then (`harness_eval_model_now`: θ0 + λ·merge(τ_1..τ_{t-1}, θ_now − θ0)); at a task's
last step that is the task's evaluated model; the hook changes nothing the run trains, nor the records without
continual evaluation."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from avalanche.core import SupervisedPlugin

from harness.api import contract
from harness.config.specs import ContinualSpec, DatasetSpec
from harness.methods import _merge_rules as rules
from harness.methods.merging import MergingPlugin, merged_with
from harness.run.engine import run_one

DIGITS_BN = DatasetSpec("digits", 5, 2, "mlp-bn")
DIGITS_3 = DatasetSpec("digits", 3, 2, "mlp-bn")


def _merging(strategy) -> MergingPlugin:
    return next(p for p in strategy.plugins if isinstance(p, MergingPlugin))


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class _Now(SupervisedPlugin):
    """Placed before the merging plugin: at the end of a task (the model as at its last step, before the
    merging plugin stores τ_t) it keeps the "now" model and the merging plugin's state."""

    def __init__(self, merging):
        super().__init__()
        self.merging, self.now = merging, []

    def after_training_exp(self, strategy, **kwargs):
        before, trained = _plugin_state(self.merging), _state(strategy.model)
        self.now.append(self.merging.harness_eval_model_now())
        after = _plugin_state(self.merging)
        assert before[:2] == after[:2] and len(before[2]) == len(after[2])
        assert all(torch.equal(a, b) for a, b in zip(before[2], after[2]))
        assert all(torch.equal(v, strategy.model.state_dict()[k]) for k, v in trained.items())


class _End(SupervisedPlugin):
    """Placed after the merging plugin: the task's evaluated model, right after its after_training_exp."""

    def __init__(self, merging):
        super().__init__()
        self.merging, self.end = merging, []

    def after_training_exp(self, strategy, **kwargs):
        self.end.append(self.merging.harness_eval_model())


def _plugin_state(plugin) -> list:
    tensors = [*plugin.merger.tensors(), *plugin.stats_merger.tensors(), *plugin.signs.tensors()]
    return [plugin.merger.n, plugin.stats_merger.n, [t.clone() for t in tensors]]


def _run_with_probes(spec):
    probes = {}

    def observer(event, t, strategy):
        if event == "before_task" and t == 0:
            merging = _merging(strategy)
            i = strategy.plugins.index(merging)
            probes["now"], probes["end"] = _Now(merging), _End(merging)
            strategy.plugins.insert(i, probes["now"])
            strategy.plugins.append(probes["end"])
    record = run_one(spec, device="cpu", observer=observer)
    assert record.ok, record.error
    return record, probes["now"], probes["end"]


@pytest.mark.parametrize("scenario, regime, method, pretrain, batchnorm", [
    ("task-il", "full", "magmax", "first-task", "recompute"),
    ("task-il", "last-1", "magmax", "first-task", "recompute"),
    ("task-il", "full", "ties", "first-task", "recompute"),
    ("task-il", "last-1", "ties", "none", "merge"),
    ("class-il", "full", "magmax", "first-task", "merge"),
    ("task-il", "full", "randmix", "none", "recompute"),
])
def test_now_at_the_last_step_is_the_evaluated_model(spec_factory, scenario, regime, method, pretrain, batchnorm):
    """At a task's last step the "now" model equals harness_eval_model() right after the task, bitwise
    (weights and BatchNorm statistics), and asking for it leaves the plugin's running merge as it was."""
    hparams = {"lam": 0.5, "finetune": "sequential", "batchnorm": batchnorm}
    if method == "ties":
        hparams["top_k"] = 20.0
    if method == "randmix":
        hparams["seed"] = 0
    # with continual evaluation on, so that the last step's "now" model reuses the copy its mid points made
    spec = spec_factory(scenario=scenario, dataset=DIGITS_3, regime=regime, method=method, hparams=hparams,
                        pretrain=pretrain, continual=ContinualSpec(4, 20))
    _, now, end = _run_with_probes(spec)
    assert len(now.now) == len(end.end) == 3
    for t, (a, b) in enumerate(zip(now.now, end.end)):
        if t == 0 and pretrain == "first-task":  # θ0 does not exist yet: the trained model, as the end's
            assert a is None and b is now.merging.model
            continue
        assert a is not None and a is not now.merging.model
        sa, sb = _state(a), _state(b)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), (t, method)


def test_merged_with_leaves_the_running_merger_as_it_is():
    torch.manual_seed(0)
    taus = [{"w": torch.randn(40), "b": torch.randn(3)} for _ in range(4)]
    for make in (rules.MagMaxMerger, lambda: rules.TiesMerger(20.0), lambda: rules.SumMerger(True),
                 lambda: rules.SumMerger(False), lambda: rules.RandMixMerger(seed=5)):
        merger, reference = make(), make()
        for tau in taus[:3]:
            merger.add(tau)
            reference.add(tau)
        kept = [t.clone() for t in merger.tensors()]
        generator = getattr(merger, "generator", None)
        state = generator.get_state() if generator is not None else None
        now = merged_with(merger, taus[3])
        assert merger.n == 3 and all(torch.equal(a, b) for a, b in zip(kept, merger.tensors()))
        assert len(merger.tensors()) == len(kept)
        if state is not None:
            assert torch.equal(state, merger.generator.get_state())
        reference.add(taus[3])  # the same as adding it for real
        assert now.keys() == reference.merged().keys()
        assert all(torch.equal(now[k], reference.merged()[k]) for k in now)
    # the batch rules by hand: MagMax is max-|τ| over the 4, TIES the batch rule over the 4
    best = rules.MagMaxMerger()
    for tau in taus[:3]:
        best.add(tau)
    hand = rules.magmax(taus)
    assert all(torch.equal(merged_with(best, taus[3])[k], hand[k]) for k in hand)
    ties = rules.TiesMerger(20.0)
    for tau in taus[:3]:
        ties.add(tau)
    hand = rules.ties(taus, 20.0)
    assert all(torch.equal(merged_with(ties, taus[3])[k], hand[k]) for k in hand)


def _final_state(spec):
    seen = {}

    def observer(event, t, strategy):
        if event == "after_task" and t == spec.dataset.n_tasks - 1:
            seen["state"] = _state(strategy.model)
            seen["rng"] = torch.get_rng_state()
    record = run_one(spec, device="cpu", observer=observer)
    assert record.ok, record.error
    return record, seen["state"], seen["rng"]


@pytest.mark.parametrize("scenario, regime, method", [("task-il", "full", "magmax"), ("class-il", "last-1", "ties")])
def test_training_is_bitwise_unchanged_with_the_hook(spec_factory, scenario, regime, method):
    """A merge with continual evaluation (its mid-task points build the merged "now" model, BatchNorm
    statistics recomputed on a copy) trains exactly as without: matrices, norms, diagnostics, memory, final
    weights and buffers, RNG state; the record without the setting has no curve."""
    off, on = (spec_factory(scenario=scenario, dataset=DIGITS_BN, regime=regime, method=method, continual=c)
               for c in (None, ContinualSpec(3, 40)))
    r_off, w_off, rng_off = _final_state(off)
    r_on, w_on, rng_on = _final_state(on)
    assert r_on.curve and r_off.curve is None
    assert r_on.acc_matrix == r_off.acc_matrix and r_on.acc_matrix_task_aware == r_off.acc_matrix_task_aware
    assert r_on.update_norms == r_off.update_norms and r_on.budget == r_off.budget
    assert r_on.diagnostics == r_off.diagnostics
    assert all(torch.equal(w_on[k], w_off[k]) for k in w_on) and w_on.keys() == w_off.keys()
    assert torch.equal(rng_on, rng_off)


class _Trained(SupervisedPlugin):
    """Keeps a copy of the trained model after the `at`-th step of each task."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.steps, self.models = at, 0, []

    def before_training_exp(self, strategy, **kwargs):
        self.steps = 0

    def after_update(self, strategy, **kwargs):
        self.steps += 1
        if self.steps == self.at:
            self.models.append(copy.deepcopy(strategy.model))


def test_mid_points_evaluate_the_merge_and_end_points_match(spec_factory):
    """Mid-task points are the merged "now" model's accuracies (not the trained model's), a point at a task's
    last step equals its end point, and the curve's end points are the matrix rows."""
    from harness.run.datasets import load_dataset
    from harness.run.evaluation import evaluate_tasks, subsample_tasks
    from harness.run.streams import split_tasks

    spec = spec_factory(dataset=DIGITS_BN, regime="full", method="magmax", continual=ContinualSpec(3, 10_000))
    trained = _Trained(at=3)
    merged = {}

    def observer(event, t, strategy):
        if event == "before_task" and t == 0:
            strategy.plugins.append(trained)
        if event == "before_task" and t == 2:  # the "now" model after the 3rd step of task 3, asked for by hand
            plugin = _merging(strategy)
            merged["plugin"] = plugin

            class Grab(SupervisedPlugin):
                def after_update(self, strategy, **kwargs):
                    if trained.steps == 3 and "model" not in merged:
                        with torch.random.fork_rng(devices=[]):
                            # a copy: the plugin reuses its "now" copy at the task's next point
                            merged["model"] = copy.deepcopy(contract.evaluated_model_now(strategy))
            strategy.plugins.append(Grab())
    record = run_one(spec, device="cpu", observer=observer)
    assert record.ok, record.error
    curve = record.curve
    steps_before = sum(record.budget["steps_per_task"][:2])
    i = curve["steps"].index(steps_before + 3)
    assert (curve["task"][i], curve["end"][i]) == (2, False)
    tasks = subsample_tasks(split_tasks(load_dataset("digits"), spec.class_order, 5, 2, spec.scenario), 10_000,
                            spec.seed)[:3]
    now_acc = evaluate_tasks(merged["model"], tasks, 512, torch.device("cpu"))
    trained_acc = evaluate_tasks(trained.models[2], tasks, 512, torch.device("cpu"))
    assert curve["acc"][i][:3] == pytest.approx(now_acc, abs=1e-12)
    assert now_acc != trained_acc  # the merge is not the trained model (task 1's accuracy differs here)
    # a point at a task's last step (every 3 divides it) equals the task's end point
    checked = 0
    for t, n in enumerate(record.budget["steps_per_task"]):
        if n % 3 == 0 and t > 0:
            end = sum(record.budget["steps_per_task"][:t + 1])
            at = [k for k, s in enumerate(curve["steps"]) if s == end]
            assert len(at) == 2 and curve["end"][at[1]] and curve["acc"][at[0]] == curve["acc"][at[1]]
            checked += 1
    assert checked == 4
    ends = [k for k, e in enumerate(curve["end"]) if e]
    assert [curve["acc"][k][:t + 1] for t, k in enumerate(ends)] == [r[:t + 1] for t, r in enumerate(record.acc_matrix)]


def test_hook_is_looked_up_like_the_eval_model_hook():
    import types

    model, other = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    plain = types.SimpleNamespace(model=model, plugins=[])
    assert contract.evaluated_model_now(plain) is model
    silent = types.SimpleNamespace(harness_eval_model_now=lambda: None)
    assert contract.evaluated_model_now(types.SimpleNamespace(model=model, plugins=[silent])) is model
    giving = types.SimpleNamespace(harness_eval_model_now=lambda: other)
    assert contract.evaluated_model_now(types.SimpleNamespace(model=model, plugins=[silent, giving])) is model
    assert contract.evaluated_model_now(types.SimpleNamespace(model=model, plugins=[giving, silent])) is other
    assert isinstance(giving, contract.EvalNowHook) and contract.EvalNowHook in contract.StrategyHooks


def test_records_without_continual_evaluation_do_not_change(spec_factory):
    """The hook is asked for only by continual evaluation: a merge's record without it is the same JSON
    whether the hook exists or not (here: with the hook disabled on the class)."""
    spec = spec_factory(dataset=DIGITS_3, regime="last-1", method="magmax")
    with_hook = run_one(spec, device="cpu").to_dict()
    saved = MergingPlugin.harness_eval_model_now
    try:
        del MergingPlugin.harness_eval_model_now
        without = run_one(spec, device="cpu").to_dict()
    finally:
        MergingPlugin.harness_eval_model_now = saved
    for data in (with_hook, without):
        data.pop("timings")  # wall times
        data["provenance"].pop("memory")  # the process's peak memory (harness/run/compute.py)
    assert json.dumps(with_hook, sort_keys=True) == json.dumps(without, sort_keys=True)


class _DrawingHook(SupervisedPlugin):
    """A careless "now" hook: draws from the torch RNG and answers None (the trained model)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def harness_eval_model_now(self):
        self.calls += 1
        torch.rand(7)
        return None


def test_a_hook_that_draws_random_numbers_does_not_change_training(spec_factory):
    """The harness asks for the "now" model inside torch.random.fork_rng: training cannot see the hook."""
    hooks, rng = [], []

    def observer(event, t, strategy):
        if event == "before_task" and t == 0:
            hooks.append(_DrawingHook())
            strategy.plugins.append(hooks[-1])
        if event == "after_task" and t == 2:
            rng.append(torch.get_rng_state())
    off, on = (spec_factory(dataset=DIGITS_3, regime="full", continual=c) for c in (None, ContinualSpec(2, 20)))
    r_off, r_on = run_one(off, device="cpu", observer=observer), run_one(on, device="cpu", observer=observer)
    assert hooks[0].calls == 0 and hooks[1].calls > 5
    assert r_on.acc_matrix == r_off.acc_matrix and r_on.update_norms == r_off.update_norms
    assert torch.equal(rng[0], rng[1])


def _draw(module, args):
    torch.rand(5)


class _NoisyOutput(SupervisedPlugin):
    """Its output is a copy of the trained model whose heads draw from the torch RNG while they answer (as MC
    dropout would)."""

    def before_training_exp(self, strategy, **kwargs):
        self.model = strategy.model

    def harness_eval_model(self):
        noisy = copy.deepcopy(self.model)
        for head in noisy.heads:
            head.register_forward_pre_hook(_draw)
        return noisy


def test_an_evaluated_model_that_draws_does_not_change_training(spec_factory):
    """Every point (the start, mid-task and end points) evaluates inside torch.random.fork_rng: a method whose
    output draws random numbers trains the same with and without continual evaluation."""
    rng = []

    def observer(event, t, strategy):
        if event == "before_task" and t == 0:
            strategy.plugins.append(_NoisyOutput())
        if event == "after_task" and t == 2:
            rng.append(torch.get_rng_state())
    off, on = (spec_factory(dataset=DIGITS_3, regime="full", continual=c) for c in (None, ContinualSpec(2, 20)))
    r_off, r_on = run_one(off, device="cpu", observer=observer), run_one(on, device="cpu", observer=observer)
    assert r_off.ok and r_on.ok and len(r_on.curve["steps"]) > 5
    assert r_on.acc_matrix == r_off.acc_matrix and r_on.update_norms == r_off.update_norms
    assert torch.equal(rng[0], rng[1])
