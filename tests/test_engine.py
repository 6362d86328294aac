"""run_one: record contents, determinism, failures and divergence as records."""
import math

import numpy as np
import pytest
import torch
from conftest import make_spec

from harness.config.metrics import all_metrics
from harness.config.specs import TrainingSpec
from harness.run.engine import run_one


@pytest.fixture(scope="module")
def naive_record():
    return run_one(make_spec(regime="last-2"), device="cpu")


@pytest.mark.slow
def test_record_contents(naive_record):
    r = naive_record
    assert r.status == "ok" and r.error is None
    R = np.asarray(r.acc_matrix)
    assert R.shape == (5, 5) and len(r.init_acc) == 5
    assert ((R >= 0) & (R <= 1)).all()
    assert r.metrics == pytest.approx(all_metrics(r.acc_matrix, r.init_acc))
    assert np.mean(np.diag(R)) > 0.8  # the tasks are learned
    assert r.update_norms["shared"][0] is None and all(u > 0 for u in r.update_norms["shared"][1:])
    assert set(r.update_norms["per_block"]) == {"fc1", "fc2", "fc3", "fc4"}
    # under last-2 only fc3/fc4 move after task 1
    assert all(u == 0 for u in r.update_norms["per_block"]["fc1"][1:])
    assert all(u > 0 for u in r.update_norms["per_block"]["fc4"][1:])
    assert r.regime_depth == 2 and r.n_blocks == 4
    assert r.params["total"] > r.params["trainable"] > 0
    assert r.provenance["versions"]["torch"]
    assert r.spec.class_order == tuple(range(10))
    assert r.to_dict()["spec"]["class_order"] == list(range(10))


@pytest.mark.slow
def test_pretrain_none_keeps_blocks_at_init_under_head():
    r = run_one(make_spec(regime="head", pretrain="none", dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp")),
                device="cpu")
    assert r.status == "ok"
    assert r.update_norms["drift"] == 0.0


@pytest.mark.slow
def test_same_spec_same_record(naive_record):
    again = run_one(make_spec(regime="last-2"), device="cpu")
    assert again.acc_matrix == naive_record.acc_matrix
    assert again.metrics == naive_record.metrics
    assert again.update_norms == naive_record.update_norms
    other_seed = run_one(make_spec(regime="last-2", seed=1), device="cpu")
    assert other_seed.acc_matrix != naive_record.acc_matrix


def test_a_raising_method_becomes_a_failed_record(tmp_path):
    bad = tmp_path / "boom.py"
    bad.write_text("NAME = 'boom'\nDEFAULTS = {}\ndef build(ctx):\n    raise RuntimeError('kaboom')\n")
    r = run_one(make_spec(method="boom"), device="cpu", method_files=(str(bad),))
    assert r.status == "failed" and r.error == "RuntimeError: kaboom"
    assert r.metrics == {} and "kaboom" in r.diagnostics["traceback"]


@pytest.mark.slow
def test_nan_loss_becomes_a_diverged_record():
    spec = make_spec(training=TrainingSpec(lr=1e6, momentum=0.9, epochs=2, batch_size=32), regime="full")
    r = run_one(spec, device="cpu")
    assert r.status == "diverged"
    assert "loss became" in r.error


@pytest.mark.slow
def test_dropping_the_harness_plugins_is_reported(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "from avalanche.training.supervised import Naive\nNAME = 'sneaky'\nDEFAULTS = {}\n"
        "def build(ctx):\n    return Naive(model=ctx.model, optimizer=ctx.optimizer, criterion=ctx.criterion,"
        " train_mb_size=32, eval_mb_size=64)\n")
    r = run_one(make_spec(method="sneaky"), device="cpu", method_files=(str(sneaky),))
    assert r.status == "failed" and "never called the harness plugins" in r.error


def test_returning_a_non_strategy_is_reported(tmp_path):
    f = tmp_path / "nostrat.py"
    f.write_text("NAME = 'nostrat'\nDEFAULTS = {}\ndef build(ctx):\n    return ctx.model\n")
    r = run_one(make_spec(method="nostrat"), device="cpu", method_files=(str(f),))
    assert r.status == "failed" and "not an Avalanche strategy" in r.error


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ewc-online", "lwf", "si", "gem", "agem", "replay", "joint"])
def test_every_builtin_baseline_runs_under_a_partial_regime(method):
    spec = make_spec(method=method, regime="last-1", dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp"),
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))
    from harness.api.registry import get_registry
    spec = spec.__class__(**{**spec.__dict__, "hparams": get_registry()[method].defaults})
    r = run_one(spec, device="cpu")
    assert r.status == "ok", r.error
    assert len(r.acc_matrix) == 3 and not math.isnan(r.metrics["acc"])


@pytest.mark.slow
def test_synaptic_intelligence_is_not_a_no_op_on_the_cpu():
    """Avalanche 0.6's SI aliases its weight snapshots on the CPU (importances all 0, SI ==
    naive); harness.compat copies them. A strong SI must now hold the weights back."""
    base = dict(regime="full", dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp"))
    off = run_one(make_spec(method="si", hparams={"si_lambda": 0.0, "eps": 1e-7}, **base), device="cpu")
    on = run_one(make_spec(method="si", hparams={"si_lambda": 1e4, "eps": 1e-7}, **base), device="cpu")
    assert off.status == on.status == "ok"
    assert on.update_norms["drift"] < 0.8 * off.update_norms["drift"]


def test_synaptic_intelligence_importance_is_positive_after_a_task():
    from avalanche.training.plugins.synaptic_intelligence import SynapticIntelligencePlugin as SI

    import harness.methods.regularization  # noqa: F401  (installs the fix when the methods load)
    model = torch.nn.Linear(3, 2)
    syn = {"old_theta": {}, "new_theta": {}, "grad": {}}
    for key in syn:
        syn[key] = {n: type("P", (), {"data": None})() for n, _ in model.named_parameters()}
    SI.extract_weights(model, syn["old_theta"], set())
    with torch.no_grad():
        model.weight.add_(1.0)
    SI.extract_weights(model, syn["new_theta"], set())
    # a copy moves by exactly the step, an alias by 0 (allclose: w + 1 - w rounds for a random w)
    assert torch.allclose(syn["new_theta"]["weight"].data - syn["old_theta"]["weight"].data, torch.ones(6))
