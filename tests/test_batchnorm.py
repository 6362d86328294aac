"""BatchNorm policies: projection methods keep old tasks' normalisation; merged models get statistics
of their own weights."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from test_gpm import digits_tasks, drive, memory_of

from harness.methods._batchnorm import batchnorm_layers
from harness.methods.merging import MergingPlugin, merged_statistics


def shifted_tasks():
    """digits' first two tasks, the second one's inputs shifted and scaled (a new input distribution)."""
    first, second = digits_tasks()[:2]
    return first, dataclasses.replace(second, x_train=3 * second.x_train + 2, x_test=3 * second.x_test + 2)


def _task1_feature_drift(method: str, hparams: dict, regime: str = "full") -> float:
    """‖F₂ − F₁‖/‖F₁‖ of task-1 test features (eval mode) after task 2 against after task 1."""
    x = digits_tasks()[0].x_test
    seen = {}

    def after(t, strategy):
        strategy.model.eval()
        with torch.no_grad():
            seen[t] = strategy.model.features(x).clone()
        strategy.model.train()
    drive(method, regime, hparams, model="small-cnn", n_tasks=2, epochs=3, after_task=after, tasks=shifted_tasks())
    return float((seen[1] - seen[0]).norm() / seen[0].norm())


def test_projected_batchnorm_keeps_task1_features_far_more_than_running_statistics():
    drift = {p: _task1_feature_drift("gpm", {"batchnorm": p}) for p in ("batch-stats", "frozen-stats", "running-stats")}
    naive = _task1_feature_drift("naive", {})
    print("task-1 feature drift after task 2:", drift, "naive:", naive)
    assert drift["batch-stats"] < 0.35 * drift["running-stats"], drift  # measured 0.16
    assert drift["frozen-stats"] < 0.7 * drift["running-stats"], drift  # measured 0.51 (task 2 at 3x scale: larger steps)
    assert drift["running-stats"] < naive  # GPM's projection still protects the weights


def test_batch_stats_layers_carry_no_running_statistics_and_frozen_stats_stay_bitwise():
    gpm, _ = drive("gpm", "full", {"batchnorm": "batch-stats"}, model="small-cnn", n_tasks=2, epochs=1)
    layers = batchnorm_layers(gpm.model, memory_of(gpm).blocks)
    assert layers and all(bn.running_mean is None and not bn.track_running_stats for bn in layers)
    snapshots = []
    frozen, _ = drive("gpm", "full", {"batchnorm": "frozen-stats"}, model="small-cnn", n_tasks=3, epochs=1,
                      after_task=lambda t, s: snapshots.append(
                          {n: b.clone() for n, b in s.model.named_buffers() if "running" in n}))
    assert snapshots[0] and all(torch.equal(snapshots[0][n], snapshots[2][n]) for n in snapshots[0])
    # with plain running statistics they follow the newest task
    plain = []
    drive("gpm", "full", {"batchnorm": "running-stats"}, model="small-cnn", n_tasks=2, epochs=1,
          after_task=lambda t, s: plain.append({n: b.clone() for n, b in s.model.named_buffers() if "running" in n}))
    assert any(not torch.equal(plain[0][n], plain[1][n]) for n in plain[0])


@pytest.mark.parametrize("method", ["gpm", "became"])
def test_unknown_batchnorm_policy_is_one_line(method):
    with pytest.raises(ValueError, match=r"hparams.batchnorm='ema'; allowed: batch-stats, frozen-stats, running-stats"):
        drive(method, "full", {"batchnorm": "ema", "stages": "full"} if method == "became" else {"batchnorm": "ema"},
              model="small-cnn", n_tasks=1, epochs=1)


# --- merged models -----------------------------------------------------------------------------

def _merging_run(method: str, batchnorm: str, **hp):
    models = []
    strategy, tasks = drive(method, "full", {"batchnorm": batchnorm, **hp}, model="small-cnn", n_tasks=3, epochs=1,
                            after_task=lambda t, s: models.append(copy.deepcopy(s.model)))
    plugin = next(p for p in strategy.plugins if isinstance(p, MergingPlugin))
    return plugin, models, tasks


def test_merge_policy_merges_statistics_by_the_rule_and_lambda():
    plugin, models, _ = _merging_run("avg", "merge")
    stats = [merged_statistics(m, plugin.blocks) for m in models]  # θ0 = the model after task 1
    evaluated = merged_statistics(plugin.harness_eval_model(), plugin.blocks)
    assert evaluated
    for name, value in evaluated.items():
        by_hand = stats[0][name] + ((stats[1][name] - stats[0][name]) + (stats[2][name] - stats[0][name])) / 2
        assert torch.allclose(value, by_hand, atol=1e-6), name


def test_recompute_policy_estimates_statistics_of_the_merged_weights_on_current_task_data():
    plugin, models, tasks = _merging_run("magmax", "recompute", lam=0.5)
    evaluated = plugin.harness_eval_model()
    # independently: per batch of task 3's training data (the plugin's batches, in order), each
    # BatchNorm's input mean and unbiased variance through the merged weights normalised by batch
    # statistics, averaged over the batches (torch.optim.swa_utils.update_bn's estimate)
    probe = copy.deepcopy(evaluated)
    for bn in batchnorm_layers(probe, plugin.blocks):
        bn.track_running_stats, bn.running_mean, bn.running_var = False, None, None
    seen: dict = {}
    hooks = [bn.register_forward_pre_hook(lambda m, a, n=n: seen.setdefault(n, []).append(a[0].detach()))
             for n, bn in probe.named_modules() if isinstance(bn, torch.nn.BatchNorm2d)]
    x = tasks[2].x_train
    with torch.no_grad():
        for start in range(0, len(x), plugin.batch_size):
            probe.features(x[start:start + plugin.batch_size])
    for h in hooks:
        h.remove()
    checked = 0
    for name, bn in evaluated.named_modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            means = torch.stack([b.mean(dim=(0, 2, 3)) for b in seen[name]]).mean(0)
            variances = torch.stack([b.var(dim=(0, 2, 3), unbiased=True) for b in seen[name]]).mean(0)
            assert torch.allclose(bn.running_mean, means, atol=1e-5), name
            assert torch.allclose(bn.running_var, variances, rtol=1e-4, atol=1e-5), name
            checked += 1
    assert checked == 3 and len(seen["blocks.conv1.1"]) == 2  # 288 samples: batches of 256 and 32
    # the unmerged model keeps its own statistics; `latest` evaluates the merge with them
    latest, latest_models, _ = _merging_run("magmax", "latest", lam=0.5)
    kept = merged_statistics(latest.harness_eval_model(), latest.blocks)
    own = merged_statistics(latest_models[-1], latest.blocks)
    assert kept and all(torch.equal(kept[n], own[n]) for n in kept)


@pytest.mark.parametrize("method", ["magmax", "ties"])
def test_unknown_merge_batchnorm_mode_is_one_line(method):
    with pytest.raises(ValueError, match=r"hparams.batchnorm='ema'; allowed: recompute, merge, latest"):
        drive(method, "full", {"batchnorm": "ema"}, n_tasks=1, epochs=1)
