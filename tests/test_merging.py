"""Merging family (MagMax, avg, task-arithmetic, TIES, RandMix): rules and harness contract."""
from __future__ import annotations

import pytest
import torch
from avalanche.core import SupervisedPlugin

from harness.api.contract import MethodContext, evaluated_model, make_optimizer
from harness.api.registry import get_registry
from harness.config.pretrain import Pretrain
from harness.config.specs import TrainingSpec
from harness.methods import _merge_rules as rules
from harness.methods.merging import MergingPlugin, merged_weights
from harness.run.engine import keep_optimizer_on_trainable, run_one
from harness.run.models import build_model
from harness.run.plugins import HarnessPlugin
from harness.run.regimes import apply_regime, trainable_blocks, trained_effective
from harness.run.streams import Task, to_avalanche

T_ = torch.tensor
TRAINING = TrainingSpec(lr=0.1, momentum=0.9, epochs=1, batch_size=16)


# --- merge rules on hand-made task vectors -----------------------------------------------

def test_magmax_picks_largest_magnitude_and_ties_go_to_later_task():
    taus = [{"w": T_([1.0, -3.0, 2.0, 0.5])}, {"w": T_([-2.0, 1.0, -2.0, 0.5])},
            {"w": T_([0.0, 3.0, 1.0, -0.1])}]
    # element 2: |−3| ties with |3| of task 3 → task 3's +3; element 3: 2 vs −2 tie → −2
    assert rules.magmax(taus)["w"].tolist() == [-2.0, 3.0, -2.0, 0.5]
    running = rules.MagMaxMerger()
    for tau in taus:
        running.add(tau)
    assert torch.equal(running.merged()["w"], rules.magmax(taus)["w"])


def test_sum_and_mean_running_match_hand_values():
    taus = [{"w": T_([1.0, 2.0])}, {"w": T_([3.0, -4.0])}, {"w": T_([2.0, 5.0])}]
    avg, total = rules.SumMerger(average=True), rules.SumMerger(average=False)
    for tau in taus:
        avg.add(tau)
        total.add(tau)
    assert total.merged()["w"].tolist() == [6.0, 3.0]
    assert avg.merged()["w"].tolist() == [2.0, 1.0]
    assert rules.mean(taus)["w"].tolist() == [2.0, 1.0]


def test_ties_trim_ranks_the_whole_vector_across_tensors():
    tau = {"a": T_([1.0, -5.0]), "b": T_([[3.0, 0.1]])}
    merged = rules.ties([tau], top_k=50)  # d=4: int(4·0.5)+1 = 3 kept, as the official code: −5, 3, 1
    assert merged["a"].tolist() == [1.0, -5.0]
    assert merged["b"].tolist() == [[3.0, 0.0]]


def _official_topk_values_mask(M: torch.Tensor, K: float) -> torch.Tensor:
    """TIES-merging's `topk_values_mask` (github.com/prateeky2806/ties-merging), as published."""
    if K > 1:
        K /= 100
    n, d = M.shape
    k = int(d * K)
    k = d - k  # keep top k elements instead of bottom k elements
    kth_values, _ = M.abs().kthvalue(k, dim=1, keepdim=True)
    return M.abs() >= kth_values


@pytest.mark.parametrize("d,top_k", [(4, 50.0), (5, 40.0), (1000, 20.0), (37, 20.0), (999, 3.0), (10, 99.0)])
def test_ties_trim_keeps_what_the_official_mask_keeps(d, top_k):
    g = torch.Generator().manual_seed(d)
    flat = torch.randn(d, generator=g)
    mask = _official_topk_values_mask(flat.unsqueeze(0), top_k)[0]
    trimmed = rules.trim_top_k(flat, top_k)
    assert torch.equal(trimmed, torch.where(mask, flat, torch.zeros_like(flat)))
    assert int((trimmed != 0).sum()) == int(d * top_k / 100) + 1


def test_ties_trim_at_100_percent_keeps_everything():
    flat = T_([1.0, -2.0, 3.0])
    assert torch.equal(rules.trim_top_k(flat, 100.0), flat)


def test_ties_elect_and_disjoint_mean_by_hand():
    taus = [{"w": T_([4.0, -1.0, 0.5, 3.0, 0.1])},
            {"w": T_([-2.0, 5.0, 0.2, -1.0, 0.3])},
            {"w": T_([1.0, 2.0, -6.0, 0.5, 0.4])}]
    # top 40 % (int(5·0.4)+1 = 3 kept): [4,-1,0,3,0], [-2,5,0,-1,0], [1,2,-6,0,0]; sums
    # [3,6,-6,2,0]; signs +,+,−,+ and the zero column gets the majority sign (+); disjoint means:
    assert rules.ties(taus, top_k=40)["w"].tolist() == [2.5, 3.5, -6.0, 3.0, 0.0]
    trimmed = T_([[2.0, 1.0, 0.0], [-2.0, 1.0, 0.0], [0.0, -3.0, 0.0]])
    signs = rules.elect_signs(trimmed)  # sums [0,−1,0]: majority of signs (0,−1,0) is −
    assert signs.tolist() == [-1.0, -1.0, -1.0]
    assert rules.disjoint_mean(trimmed, signs).tolist() == [-2.0, -3.0, 0.0]
    with pytest.raises(ValueError, match="top_k"):
        rules.ties(taus, top_k=0)


def _three_random_taus(n=30000):
    g = torch.Generator().manual_seed(123)
    return [{"w": torch.randn(n, generator=g) + 10 * i} for i in range(3)]  # disjoint ranges


def _source_freqs(merged, taus):
    w = merged["w"]
    hits = torch.stack([w == tau["w"] for tau in taus])
    assert bool((hits.sum(0) == 1).all())  # every element comes from exactly one task
    return (hits.float().mean(1)).tolist()


def test_randmix_running_reservoir_reproducible_and_uniform():
    taus = _three_random_taus()

    def run(seed):
        m = rules.RandMixMerger(seed)
        for tau in taus:
            m.add(tau)
        return m.merged()["w"].clone()

    assert torch.equal(run(5), run(5)) and not torch.equal(run(5), run(6))
    assert all(abs(f - 1 / 3) < 0.02 for f in _source_freqs({"w": run(5)}, taus))


def test_sign_conflict_fraction_by_hand():
    taus = [{"w": T_([1.0, -1.0, 0.0, 2.0, 1.0])}, {"w": T_([1.0, 1.0, 3.0, 0.0, 1.0])},
            {"w": T_([-1.0, 1.0, 0.0, 0.0, 1.0])}]
    counter = rules.SignCounter()
    counter.add(taus[0])
    assert counter.conflict_fraction() is None  # one task vector: nothing moved twice
    for tau in taus[1:]:
        counter.add(tau)
    # moved by >= 2 task vectors: elements 0, 1, 4; conflicting among them: 0 and 1
    assert counter.conflict_fraction() == pytest.approx(2 / 3)


# --- the plugin inside an Avalanche strategy ---------------------------------------------

def synthetic_tasks(n_tasks, shape=(16,), n=48, seed=0):
    """Linearly separable binary tasks on random inputs (task t: sign of feature t)."""
    g = torch.Generator().manual_seed(seed)
    tasks = []
    for t in range(n_tasks):
        x = torch.randn(n, *shape, generator=g)
        y = (x.reshape(n, -1)[:, t] > 0).long()
        tasks.append(Task(t, (2 * t, 2 * t + 1), x, y, x[:16], y[:16]))
    return tasks


class Probe(SupervisedPlugin):
    """Records the model's state before the first training step of every task (after every
    plugin's before_training_exp, so after an independent-fine-tuning reset)."""

    def __init__(self):
        super().__init__()
        self.starts = []
        self._fresh = False

    def before_training_exp(self, strategy, **kwargs):
        self._fresh = True

    def before_training_iteration(self, strategy, **kwargs):
        if self._fresh:
            self.starts.append(_state(strategy.model))
            self._fresh = False


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_steps(method, n_tasks=3, regime="last-2", pretrain="first-task", model="mlp",
              shape=(16,), **hparams):
    """Drive an adapter like the engine does; per task: current, evaluated and after-eval states."""
    torch.manual_seed(0)
    net = build_model(model, shape, n_heads=n_tasks, head_classes=2)
    first = "full" if pretrain == "first-task" else regime
    apply_regime(net, first)
    probe = Probe()
    ctx = MethodContext(
        model=net, optimizer=make_optimizer(TRAINING, (p for p in net.parameters() if p.requires_grad)),
        criterion=torch.nn.CrossEntropyLoss(), train_mb_size=16, eval_mb_size=64, train_epochs=1,
        device=torch.device("cpu"), plugins=(HarnessPlugin(), probe), n_tasks=n_tasks,
        regime=regime, pretrain=Pretrain(pretrain), scenario="task-il", seed=0, training=TRAINING,
        regime_blocks=tuple(trainable_blocks(net, regime)), regime_params=tuple(trained_effective(net, regime)))
    adapter = get_registry()[method]
    strategy = adapter.build(ctx, **{**adapter.defaults, **hparams})
    keep_optimizer_on_trainable(strategy)
    plugin = next(p for p in strategy.plugins if isinstance(p, MergingPlugin))
    steps = []
    for t, exp in enumerate(to_avalanche(synthetic_tasks(n_tasks, shape)).train_stream):
        apply_regime(strategy.model, first if t == 0 else regime)
        strategy.train(exp)
        current = _state(strategy.model)
        evaluated = _state(evaluated_model(strategy))
        steps.append({"current": current, "evaluated": evaluated, "after": _state(strategy.model)})
    return plugin, probe, steps


def _merged_keys(regime, model="mlp", shape=(16,)):
    net = build_model(model, shape, 1, 2)
    return set(merged_weights(net, trained_effective(net, regime)))


@pytest.mark.parametrize("pretrain", ["first-task", "none"])
def test_evaluated_model_is_theta0_plus_lambda_magmax_of_task_vectors(pretrain):
    plugin, probe, steps = run_steps("magmax", n_tasks=4, pretrain=pretrain)
    keys = _merged_keys("last-2")
    theta0 = steps[0]["current"] if pretrain == "first-task" else probe.starts[0]
    trained = steps[1:] if pretrain == "first-task" else steps
    if pretrain == "first-task":  # after task 1 the evaluated model is θ_1 = θ0 itself
        assert all(torch.equal(steps[0]["evaluated"][k], theta0[k]) for k in keys)
    for i, step in enumerate(trained):
        taus = [{k: s["current"][k] - theta0[k] for k in keys} for s in trained[:i + 1]]
        expect = rules.magmax(taus)
        for k in keys:
            assert torch.allclose(step["evaluated"][k], theta0[k] + 0.5 * expect[k], atol=1e-6)
    assert plugin.harness_diagnostics()["task_vector_norms"][-1] == pytest.approx(
        [float(torch.sqrt(sum(((s["current"][k] - theta0[k]) ** 2).sum() for k in keys)))
         for s in trained])
    assert len(plugin.harness_diagnostics()["sign_conflicts"]) == 4


@pytest.mark.parametrize("method", ["magmax", "ties"])
def test_training_continues_from_the_unmerged_checkpoint(method):
    _, probe, steps = run_steps(method, n_tasks=3)
    keys = _merged_keys("last-2")
    for t in range(2):
        start_next = probe.starts[t + 1]
        assert all(torch.equal(start_next[k], v) for k, v in steps[t]["current"].items())
    # the merge really differs from θ_t once a task vector exists (else the check is vacuous)
    assert any(not torch.equal(steps[1]["evaluated"][k], steps[1]["current"][k]) for k in keys)


def test_heads_are_never_merged_and_each_comes_from_its_own_task():
    _, _, steps = run_steps("magmax", n_tasks=3, regime="full")
    for t, step in enumerate(steps):
        for i in range(3):
            for part in ("weight", "bias"):
                key = f"heads.{i}.{part}"
                assert torch.equal(step["evaluated"][key], step["current"][key])
                if i <= t:  # head i still equals its checkpoint right after task i
                    assert torch.equal(step["current"][key], steps[i]["current"][key])


@pytest.mark.parametrize("pretrain", ["first-task", "none"])
def test_frozen_parameters_and_buffers_bitwise_unchanged_under_head(pretrain):
    _, probe, steps = run_steps("magmax", n_tasks=3, regime="head", pretrain=pretrain,
                                model="small-cnn", shape=(1, 8, 8))
    reference = steps[0]["current"] if pretrain == "first-task" else probe.starts[0]
    blocks = [k for k in reference if k.startswith("blocks.")]
    assert any("running_mean" in k for k in blocks)  # BatchNorm buffers are covered
    for step in steps[1:] if pretrain == "first-task" else steps:
        for k in blocks:
            assert torch.equal(step["evaluated"][k], reference[k]), k
            assert torch.equal(step["current"][k], reference[k]), k


def test_frozen_blocks_untouched_by_merging_under_last_1():
    _, _, steps = run_steps("magmax", n_tasks=3, regime="last-1")
    frozen = [k for k in steps[0]["current"] if k.startswith("blocks.") and "fc4" not in k]
    for step in steps:
        assert all(torch.equal(step["evaluated"][k], steps[0]["current"][k]) for k in frozen)


def test_independent_finetuning_restarts_shared_params_from_theta0_not_heads():
    _, probe, steps = run_steps("magmax", n_tasks=3, finetune="independent")
    keys = _merged_keys("last-2")
    theta0 = steps[0]["current"]
    for t in (1, 2):
        assert all(torch.equal(probe.starts[t][k], theta0[k]) for k in keys)
    assert torch.equal(probe.starts[2]["heads.1.weight"], steps[1]["current"]["heads.1.weight"])


def _stored_numel(method, n_tasks):
    plugin, _, _ = run_steps(method, n_tasks=n_tasks, pretrain="none")
    return sum(t.numel() for t in plugin.stored_tensors())


@pytest.mark.parametrize("method", ["magmax", "avg", "randmix"])
def test_constant_memory(method):
    # θ0 + one running merge + two sign counters = 4 copies of the merged parameters
    net = build_model("mlp", (16,), 1, 2)
    per_copy = sum(p.numel() for p in merged_weights(net, trained_effective(net, "last-2")).values())
    assert _stored_numel(method, 3) == _stored_numel(method, 5) == 4 * per_copy


def test_ties_memory_grows_with_tasks():
    assert _stored_numel("ties", 5) > _stored_numel("ties", 3)


# --- through the engine ----------------------------------------------------------------

def _spec(make, method, **hparams):
    return make(method=method, regime="last-2", hparams=hparams,
                training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))


@pytest.mark.slow
def test_harness_measures_the_merged_model(spec_factory):
    # λ = 0 keeps every evaluated model at θ0: update norms vanish although training moved θ
    frozen = run_one(_spec(spec_factory, "magmax", lam=0.0), device="cpu")
    naive = run_one(_spec(spec_factory, "naive"), device="cpu")
    assert frozen.status == "ok" and naive.status == "ok"
    assert frozen.update_norms["shared"][1:] == [0.0] * 4
    assert all(u > 0 for u in naive.update_norms["shared"][1:])
    diag = frozen.diagnostics
    assert [len(n) for n in diag["task_vector_norms"]] == [0, 1, 2, 3, 4]
    assert diag["sign_conflicts"][:2] == [None, None] and all(0 <= c <= 1 for c in diag["sign_conflicts"][2:])


def test_bad_finetune_value_fails_with_a_clear_message(spec_factory):
    record = run_one(_spec(spec_factory, "magmax", finetune="parallel"), device="cpu")
    assert record.status == "failed" and "finetune must be one of sequential, independent" in record.error


def test_registry_lists_the_merging_family():
    registry = get_registry()
    for name in ("magmax", "avg", "task-arithmetic", "ties", "randmix"):
        assert registry[name].family == "merging"
