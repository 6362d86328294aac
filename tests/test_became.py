"""BECAME: Fisher, closed-form α, merge endpoints, Fisher accumulation, regimes, sweep."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from test_gpm import check_regime, drive
from torch import nn

from harness.methods._gpm_math import closed_form_alpha, diag_fisher, merge_tensors
from harness.methods.became import SWEEP_GRID


class SoftmaxRegression(nn.Module):
    """A task-aware linear classifier: its CE gradient has a closed form."""

    def __init__(self, d_in: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(d_in, classes)

    def forward(self, x, task):
        return self.fc(x)


def test_fisher_equals_per_batch_brute_force():
    gen = torch.Generator().manual_seed(0)
    model = SoftmaxRegression(5, 3)
    x = torch.randn(23, 5, generator=gen)
    batches = [(x[i:i + 8], 0) for i in range(0, 23, 8)]  # 8, 8, 7: |B| weighting matters
    fisher = diag_fisher(model, batches, dict(model.named_parameters()))
    w, b = model.fc.weight.detach().double(), model.fc.bias.detach().double()
    fw, fb = torch.zeros_like(w), torch.zeros_like(b)
    for xb, _ in batches:
        xb = xb.double()
        p = torch.softmax(xb @ w.T + b, dim=1)
        resid = p - nn.functional.one_hot(p.argmax(1), 3).double()  # targets: own argmax
        fw += len(xb) * (resid.T @ xb / len(xb)) ** 2
        fb += len(xb) * resid.mean(0) ** 2
    assert torch.allclose(fisher["fc.weight"].double(), fw / 23, rtol=1e-4, atol=1e-9)
    assert torch.allclose(fisher["fc.bias"].double(), fb / 23, rtol=1e-4, atol=1e-9)


def test_alpha_equals_hand_computation():
    f_new = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    f_old = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([1.0])}
    delta = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0])}
    # numerator 1 + 2 + 0.5·4 = 5; denominator 5 + 3 + 0 + 1·4 = 12
    assert closed_form_alpha(f_new, f_old, delta) == pytest.approx(5 / 12)
    assert closed_form_alpha(f_new, {}, delta) == pytest.approx(1.0)  # no old Fisher: all new
    assert closed_form_alpha(f_new, f_old, {k: torch.zeros_like(v) for k, v in delta.items()}) == 0.0
    assert closed_form_alpha(f_new, f_old, {"a": delta["a"]}) == pytest.approx(3 / 6)  # only named params


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_alpha_lies_in_unit_interval(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (int(torch.randint(1, 6, (1,), generator=gen)),)
    f_new, f_old = torch.rand(shape, generator=gen) ** 3, torch.rand(shape, generator=gen) ** 3
    delta = torch.randn(shape, generator=gen) * 10 ** float(torch.randint(-4, 4, (1,), generator=gen))
    alpha = closed_form_alpha({"p": f_new}, {"p": f_old}, {"p": delta})
    assert 0.0 <= alpha <= 1.0
    merged = merge_tensors(torch.zeros(shape), delta, alpha)
    assert torch.all(merged.abs() <= delta.abs() + 1e-6)  # the merge lies between the endpoints


def test_merge_is_exact_at_endpoints_and_on_equal_entries():
    gp, free = torch.tensor([0.1, 0.7, 3.3]), torch.tensor([0.3, 0.7, -1.1])
    assert torch.equal(merge_tensors(gp, free, 0.0), gp)
    assert torch.equal(merge_tensors(gp, free, 1.0), free)
    assert merge_tensors(gp, free, 0.3)[1] == 0.7  # unchanged entries stay bitwise


def _became(hparams, n_tasks=2, **kw):
    seen = {}

    def after(t, s):
        seen[t] = {"f_old": {n: f.clone() for n, f in s.f_old.items()},
                   "params": {n: p.detach().clone() for n, p in s.model.named_parameters()}}
    strategy, tasks = drive("became", "last-2", hparams, n_tasks=n_tasks, epochs=2, after_task=after, **kw)
    return strategy, tasks, seen


def _trainable(strategy):
    return {n: p.detach() for n, p in strategy.model.named_parameters() if p.requires_grad}


def _sweep_endpoint_matches(became, tasks, index):
    """The sweep's grid point equals the evaluated accuracy of the final model on seen tasks."""
    from harness.run.evaluation import evaluate_tasks

    accs = evaluate_tasks(became.model, tasks[:2], 256, torch.device("cpu"))
    assert became.sweeps[1]["grid"][index]["acc_seen"] == pytest.approx(sum(accs) / 2)


def test_alpha_zero_reproduces_gpm_only_parameters():
    # the official schedule (each stage all the epochs): its GPM stage is GPM's training
    became, tasks, _ = _became({"alpha": 0.0, "alpha_sweep": True, "stages": "full"})
    assert became.alphas[1] == 0.0 and 0.0 <= became.closed_forms[1] <= 1.0
    for n, p in _trainable(became).items():
        assert torch.equal(p, became.theta_gp[n]), n
    # independently: GPM training of task 2 (same seed, same task-1 model) gives the same model
    gpm, _ = drive("gpm", "last-2", n_tasks=2, epochs=2)
    gpm_params = dict(gpm.model.named_parameters())
    for n, p in became.model.named_parameters():
        assert torch.equal(p, gpm_params[n]), n
    _sweep_endpoint_matches(became, tasks, 0)


def test_alpha_one_reproduces_stage2_parameters_and_hand_alpha():
    became, tasks, seen = _became({"alpha": 1.0, "alpha_sweep": True})
    differs = False
    for n, p in _trainable(became).items():
        assert torch.equal(p, became.theta_free[n]), n
        differs |= not torch.equal(became.theta_gp[n], became.theta_free[n])
    assert differs  # stage 2 did train
    _sweep_endpoint_matches(became, tasks, -1)
    # the recorded closed forms, recomputed by hand from θ_gp, θ_free, F_1 and the Fisher at θ_free:
    # by default over every trainable parameter (heads included, as the official code), and
    # over the shared blocks only (the heads-excluded ablation)
    f_free = became._fisher(_experience_dataset(tasks, 1), "check")
    sums = {"all": [0.0, 0.0], "shared": [0.0, 0.0]}
    for n in _trainable(became):
        d2 = (became.theta_free[n] - became.theta_gp[n]).double() ** 2
        num, den = float((f_free[n].double() * d2).sum()), float(((f_free[n] + seen[0]["f_old"][n]).double() * d2).sum())
        for key in ("all",) + (("shared",) if n.startswith("blocks.") else ()):
            sums[key][0] += num
            sums[key][1] += den
    diag = became.harness_diagnostics()
    assert diag["alpha_closed_form_all"][1] == pytest.approx(sums["all"][0] / sums["all"][1], rel=1e-6)
    assert diag["alpha_closed_form_shared"][1] == pytest.approx(sums["shared"][0] / sums["shared"][1], rel=1e-6)
    assert became.closed_forms[1] == diag["alpha_closed_form_all"][1]  # the default: the official sum
    # the new head's old Fisher is 0, so it can only pull α towards θ_free
    assert diag["alpha_closed_form_all"][1] >= diag["alpha_closed_form_shared"][1]


def test_heads_excluded_alpha_is_an_option():
    became, _, _ = _became({"alpha": "auto", "alpha_include_heads": False})
    diag = became.harness_diagnostics()
    assert became.alphas[1] == diag["alpha_closed_form_shared"][1] != diag["alpha_closed_form_all"][1]


@pytest.mark.slow
@pytest.mark.parametrize("stages, epochs, expected", [("split", 2, [1, 1]), ("split", 3, [2, 1]),
                                                      ("full", 2, [2, 2])])
def test_stage_budget_splits_or_doubles_the_epochs(stages, epochs, expected):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import make_spec

    from harness.config.specs import TrainingSpec
    from harness.run.engine import run_one

    common = dict(regime="last-2", dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp"),
                  training=TrainingSpec(lr=0.05, momentum=0.9, epochs=epochs, batch_size=32))
    became = run_one(make_spec(method="became", hparams={"stages": stages}, **common), device="cpu")
    naive = run_one(make_spec(method="naive", **common), device="cpu")
    assert became.ok and naive.ok, (became.error, naive.error)
    assert became.budget["epochs_per_stage"] == [[epochs], expected, expected]
    assert became.diagnostics["stage_epochs"] == expected
    steps, base = became.budget["steps_per_task"], naive.budget["steps_per_task"]
    assert steps[0] == base[0]  # task 1 trains normally
    per_epoch = [b // epochs for b in base]
    assert steps[1:] == [sum(expected) * e for e in per_epoch[1:]]
    if stages == "split":
        assert became.budget["optimizer_steps"] == naive.budget["optimizer_steps"]  # equal budget


def test_split_stages_need_two_epochs():
    with pytest.raises(ValueError, match="hparams.stages='split' needs training.epochs >= 2"):
        drive("became", "last-1", n_tasks=1, epochs=1)


def test_auto_alpha_merge_fisher_accumulation_and_diagnostics():
    became, tasks, seen = _became({"alpha": "auto", "alpha_sweep": True})
    alpha = became.alphas[1]
    assert alpha == became.closed_forms[1] and 0.0 < alpha < 1.0
    for n, p in _trainable(became).items():
        expected = (1 - alpha) * became.theta_gp[n] + alpha * became.theta_free[n]
        assert torch.allclose(p, expected, atol=1e-7), n
    # frozen blocks and other tasks' heads are untouched by the merge
    assert torch.equal(seen[1]["params"]["heads.0.weight"], seen[0]["params"]["heads.0.weight"])
    assert torch.equal(seen[1]["params"]["blocks.fc1.1.weight"], seen[0]["params"]["blocks.fc1.1.weight"])
    # F_old after task 2 = F_1 + Fisher at the merged model on task 2's data
    f_merged = became._fisher(_experience_dataset(tasks, 1), "check")
    for n, f in became.f_old.items():
        expected = seen[0]["f_old"][n] + f_merged[n] if n in f_merged else seen[0]["f_old"][n]
        assert torch.allclose(f, expected, rtol=1e-5, atol=1e-12), n
    diag = became.harness_diagnostics()
    assert diag["alpha"] == [None, alpha] and diag["alpha_sweep"][0] is None
    sweep = diag["alpha_sweep"][1]
    assert [g["alpha"] for g in sweep["grid"]] == list(SWEEP_GRID) and sweep["closed_form"] == alpha
    assert all(0.0 <= g["acc_seen"] <= 1.0 for g in sweep["grid"])
    # memory only for the regime's layers, although task 1 trained the full network
    assert set(diag["gpm_memory_dims"]) == {"blocks.fc3.0", "blocks.fc4.0"}
    assert all(len(v) == 2 for v in diag["gpm_memory_dims"].values())


def test_heads_enter_alpha_only_when_asked():
    f = {"blocks.w": torch.tensor([1.0]), "heads.1.w": torch.tensor([4.0])}
    delta = {"blocks.w": torch.tensor([1.0])}
    assert closed_form_alpha(f, {"blocks.w": torch.tensor([1.0])}, delta) == pytest.approx(0.5)
    with_heads = {**delta, "heads.1.w": torch.tensor([1.0])}  # F_old of a new head is 0
    assert closed_form_alpha(f, {"blocks.w": torch.tensor([1.0])}, with_heads) == pytest.approx(5 / 6)


def _experience_dataset(tasks, t):
    from harness.run.streams import to_avalanche

    return to_avalanche(tasks).train_stream[t].dataset


@pytest.mark.parametrize("regime", ["head", "last-1"])
def test_became_respects_regime(regime):
    check_regime("became", regime, {"stages": "full"})  # one epoch: nothing to split


@pytest.mark.parametrize("key, value", [("alpha", 1.5), ("alpha", "best"), ("stage2_lr", 0),
                                        ("stage1_epochs", 0), ("alpha_sweep", "yes"), ("eps_base", 1.2)])
def test_bad_hyperparameters_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"hparams.{key}="):
        drive("became", "last-1", {key: value}, n_tasks=1)


@pytest.mark.slow
def test_alpha_zero_is_the_same_run_as_gpm_over_many_tasks():
    """Stage 2 must not shift later tasks' minibatch order (found in review: from task 3 on,
    BECAME at alpha = 0 trained GPM on other batches)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import make_spec

    from harness.run.engine import run_one

    common = dict(regime="last-2", dataset=make_spec().dataset.__class__("digits", 4, 2, "mlp"))
    gpm = run_one(make_spec(method="gpm", hparams={"eps_base": 0.97, "eps_step": 0.003, "n_samples": 200},
                            **common), device="cpu")
    from harness.api.registry import get_registry
    hp = {**get_registry()["became"].defaults, "alpha": 0.0, "stages": "full"}  # GPM's epochs in stage 1
    became = run_one(make_spec(method="became", hparams=hp, **common), device="cpu")
    assert gpm.status == became.status == "ok", (gpm.error, became.error)
    assert became.update_norms["shared"] == gpm.update_norms["shared"]
    assert became.acc_matrix == gpm.acc_matrix
