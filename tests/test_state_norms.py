"""Update norms and drift of method-owned state (contract.StateHook: prompts, prototypes), checked by hand.

The definitions are in docs/update-norms.md: names both snapshots have, rows both have for a tensor whose
first dimension grows, a tensor or row new at t contributes nothing; per-block norms name the state's block.
"""
import math
import types

import numpy as np
import pytest
import torch
from conftest import make_spec

from harness.api import contract
from harness.run.norms import block_of, update_norms


def _old_update_norms(snapshots: list) -> dict:
    """harness/run/norms.py's update_norms before the state hook (git a096f78), verbatim: the reference
    the new one must equal bitwise on snapshots without method-owned state."""
    def _sq(tensors) -> float:
        return float(sum(float(t.double().pow(2).sum()) for t in tensors))

    shared, relative = [None], [None]
    blocks = list(dict.fromkeys(block_of(n) for n in snapshots[0])) if snapshots else []
    per_block = {b: [None] for b in blocks}
    for prev, cur in zip(snapshots, snapshots[1:]):
        diffs = {n: cur[n] - prev[n] for n in cur}
        u = math.sqrt(_sq(diffs.values()))
        shared.append(u)
        base = math.sqrt(_sq(prev.values()))
        relative.append(u / base if base > 0 else None)
        for b in blocks:
            per_block[b].append(math.sqrt(_sq(d for n, d in diffs.items() if block_of(n) == b)))
    drift = None
    if len(snapshots) >= 2:
        drift = math.sqrt(_sq(snapshots[-1][n] - snapshots[0][n] for n in snapshots[0]))
    return {"shared": shared, "relative": relative, "per_block": per_block, "drift": drift}


def test_without_state_the_numbers_are_bitwise_those_of_before():
    g = torch.Generator().manual_seed(0)
    shapes = {"blocks.a.weight": (7, 5), "blocks.a.bias": (7,), "blocks.b.weight": (3, 7), "blocks.c.prompt": (1, 2, 4)}
    snaps = [{n: torch.randn(s, generator=g) * (t + 1) for n, s in shapes.items()} for t in range(5)]
    assert update_norms(snaps) == _old_update_norms(snaps)  # == on floats: bitwise
    assert update_norms(snaps[:1]) == _old_update_norms(snaps[:1])


def _by_hand(pairs) -> float:
    """‖a − b‖₂ over (a, b) numpy pairs."""
    return math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in pairs))


def test_growing_rows_and_fixed_state_by_hand():
    w = [np.array([1.0, 2.0]), np.array([1.0, 5.0]), np.array([0.0, 5.0])]
    protos = [np.array([[1.0, 0.0]]),                                     # 1 class
              np.array([[1.0, 3.0], [9.0, 9.0]]),                         # class 0 moved by (0, 3); class 1 new
              np.array([[0.0, 3.0], [9.0, 5.0], [7.0, 7.0]])]             # class 0 by (−1, 0), class 1 by (0, −4)
    key = [np.array([2.0]), np.array([2.0]), np.array([14.0])]          # prompts: moves by 12 at t = 3
    snaps = [{"blocks.fc.weight": torch.tensor(w[t]), "prototypes.means": torch.tensor(protos[t]),
              "prompts.key": torch.tensor(key[t])} for t in range(3)]
    out = update_norms(snaps)
    assert out["per_block"]["prototypes"] == [None, pytest.approx(3.0), pytest.approx(math.sqrt(1 + 16))]
    assert out["per_block"]["prompts"] == [None, 0.0, pytest.approx(12.0)]
    assert out["per_block"]["fc"] == [None, pytest.approx(3.0), pytest.approx(1.0)]
    assert out["shared"] == [None, pytest.approx(math.sqrt(9 + 9)), pytest.approx(math.sqrt(1 + 17 + 144))]
    # relative: over the coordinates compared (task 1's one prototype row at t = 2)
    base2 = math.sqrt(1 + 4 + 1 + 4)
    base3 = math.sqrt(1 + 25 + 1 + 9 + 81 + 81 + 4)
    assert out["relative"][1:] == [pytest.approx(math.sqrt(18) / base2), pytest.approx(math.sqrt(162) / base3)]
    # drift: rows present at task 1 and task T (class 0 only): (0, 3) − (1, 0)
    drift = _by_hand([(w[2], w[0]), (protos[2][:1], protos[0]), (key[2], key[0])])
    assert out["drift"] == pytest.approx(drift) and out["drift"] == pytest.approx(math.sqrt(1 + 9 + 1 + 9 + 144))


def test_a_tensor_new_at_t_contributes_nothing_and_its_block_starts_there():
    s1 = {"blocks.fc.weight": torch.tensor([1.0])}
    s2 = {"blocks.fc.weight": torch.tensor([4.0]), "prototypes.means": torch.tensor([[100.0]])}
    s3 = {"blocks.fc.weight": torch.tensor([4.0]), "prototypes.means": torch.tensor([[101.0], [50.0]])}
    out = update_norms([s1, s2, s3])
    assert out["shared"] == [None, 3.0, 1.0]
    assert out["per_block"]["prototypes"] == [None, None, 1.0]  # nothing to compare at t = 2
    assert out["drift"] == 3.0  # the prototypes are not in task 1's snapshot


def test_only_the_first_dimension_may_change():
    s1 = {"prototypes.means": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match=r"prototypes.means changed shape from \(2, 3\) to \(2, 4\)"):
        update_norms([s1, {"prototypes.means": torch.zeros(2, 4)}])


class _Provider:
    def __init__(self, state):
        self.state = state

    def harness_state(self):
        return self.state


def test_method_state_merges_the_strategy_and_its_plugins_in_order():
    a, b = torch.ones(2), torch.zeros(3, 1)
    strategy = types.SimpleNamespace(plugins=[object(), _Provider({"prototypes.means": b})])
    assert contract.method_state(strategy) == {"prototypes.means": b}
    strategy = _Provider({"prompts.key": a})
    strategy.plugins = [_Provider({"prototypes.means": b}), _Provider(None)]
    assert list(contract.method_state(strategy)) == ["prompts.key", "prototypes.means"]
    assert contract.method_state(types.SimpleNamespace(plugins=[])) == {}
    assert isinstance(strategy, contract.StateHook) and contract.StateHook in contract.StrategyHooks


@pytest.mark.parametrize("state, message", [
    ({"blocks.fc.weight": torch.ones(1)}, "block one of prompts, prototypes"),
    ({"prompts": torch.ones(1)}, "a name must be <block>.<name>"),
    ({"prompts.key": [1.0]}, "values must be tensors"),
])
def test_method_state_refuses_what_norms_cannot_name(state, message):
    with pytest.raises(ValueError, match=message):
        contract.method_state(types.SimpleNamespace(plugins=[_Provider(state)]))


def test_method_state_refuses_a_name_two_providers_return():
    plugins = [_Provider({"prompts.key": torch.ones(1)}), _Provider({"prompts.key": torch.ones(1)})]
    with pytest.raises(ValueError, match="another provider returned already"):
        contract.method_state(types.SimpleNamespace(plugins=plugins))


# A tiny method: naive with a plugin that keeps, after each task, the mean feature of each class seen
# (a growing prototypes tensor, rows by class in arrival order, recomputed with the model of that time)
# and a fixed-size "prompt" (the mean of the rows of the first weight matrix).
METHOD = '''
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive

from harness.methods.rehearsal import rows_of

NAME = "naive-protos"
DEFAULTS = {}


class Protos(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.x, self.y, self.means, self.key = [], [], None, None

    @torch.no_grad()
    def after_training_exp(self, strategy, **kwargs):
        x, y, _ = rows_of(strategy.experience.dataset)
        self.x.append(x)
        self.y.append(y)
        xs, ys = torch.cat(self.x), torch.cat(self.y)
        feats = strategy.model.features(xs)
        classes = list(dict.fromkeys(ys.tolist()))
        self.means = torch.stack([feats[ys == c].mean(0) for c in classes])
        self.key = next(p for p in strategy.model.blocks.parameters() if p.dim() == 2).mean(0, keepdim=True)

    def harness_state(self):
        return {"prototypes.means": self.means, "prompts.key": self.key}


def build(ctx):
    return Naive(**ctx.strategy_kwargs(Protos()))
'''


@pytest.fixture(scope="module")
def protos_run(tmp_path_factory):
    from harness.run.engine import run_one
    from harness.run.models import shared_effective_weights

    path = tmp_path_factory.mktemp("m") / "naive_protos.py"
    path.write_text(METHOD)
    seen = []

    def observer(event, t, strategy):
        if event == "after_task":
            plugin = next(p for p in strategy.plugins if hasattr(p, "harness_state"))
            weights = {n: w.double().numpy().copy() for n, w in shared_effective_weights(strategy.model).items()}
            seen.append((weights, plugin.means.double().numpy().copy(), plugin.key.double().numpy().copy()))

    spec = make_spec(method="naive-protos", dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp"),
                     regime="full", scenario="class-il")
    record = run_one(spec, device="cpu", method_files=(str(path),), observer=observer)
    return record, seen


def test_a_run_with_state_records_its_blocks_norms_as_computed_by_hand(protos_run):
    record, seen = protos_run
    assert record.status == "ok", record.error
    norms = record.update_norms
    assert {"prototypes", "prompts", "fc1"} <= set(norms["per_block"])
    assert [len(m) for _, m, _ in seen] == [2, 4, 6]  # two classes a task
    for t in (1, 2):
        (w0, m0, k0), (w1, m1, k1) = seen[t - 1], seen[t]
        proto = _by_hand([(m1[:len(m0)], m0)])
        prompt = _by_hand([(k1, k0)])
        shared = _by_hand([(w1[n], w0[n]) for n in w1])
        assert norms["per_block"]["prototypes"][t] == pytest.approx(proto, rel=1e-6)
        assert norms["per_block"]["prompts"][t] == pytest.approx(prompt, rel=1e-6)
        assert norms["shared"][t] == pytest.approx(math.sqrt(proto**2 + prompt**2 + shared**2), rel=1e-6)
        assert proto > 0 and prompt > 0
    (w0, m0, k0), (wT, mT, kT) = seen[0], seen[-1]
    drift = _by_hand([*((wT[n], w0[n]) for n in wT), (mT[:2], m0), (kT, k0)])
    assert norms["drift"] == pytest.approx(drift, rel=1e-6)


def test_a_record_with_state_blocks_is_written_and_read_back_valid(protos_run, tmp_path):
    from harness.execution.store import read_record, write_record

    record, _ = protos_run
    path = write_record(tmp_path, record)
    back, problem = read_record(path)
    assert problem is None and back.update_norms == record.update_norms


def test_state_a_method_cannot_compare_fails_its_run(tmp_path):
    from harness.run.engine import run_one

    bad = METHOD.replace('"prototypes.means"', '"means"')
    path = tmp_path / "bad_protos.py"
    path.write_text(bad.replace("naive-protos", "bad-protos"))
    spec = make_spec(method="bad-protos", dataset=make_spec().dataset.__class__("digits", 2, 2, "mlp"))
    record = run_one(spec, device="cpu", method_files=(str(path),))
    assert record.status == "failed" and "harness_state() of Protos returned 'means'" in record.error
