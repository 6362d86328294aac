"""The learning checks' closed-form probe (checks version 2, harness/run/probe.py) against independent
routes: scikit-learn's RidgeClassifier on the same standardised features, and a hand computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import RidgeClassifier

from harness.run import checks, probe
from harness.run.streams import Task


def _data(n, d, k, seed):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k + 3  # class labels need not start at 0
    x = rng.normal(size=(n, d)) + 0.7 * (y[:, None] == (np.arange(d) % k + 3)[None])
    return x, y


@pytest.mark.parametrize("n,d,k", [(200, 10, 2), (300, 20, 4), (30, 80, 2), (40, 120, 5)])
def test_ridge_equals_sklearns_ridge_classifier(n, d, k):
    """Primal (d ≤ n) and dual (d > n), two and more classes: sklearn's RidgeClassifier(alpha=1), same scores."""
    x, y = _data(n, d, k, seed=n + d)
    x_test, y_test = _data(97, d, k, seed=1)
    fit = probe.ridge_fit(x, y)
    ref = RidgeClassifier(alpha=1.0).fit(x, y)
    classes, w, b = fit
    scores = x_test @ w + b
    np.testing.assert_allclose(scores.ravel() if k == 2 else scores, ref.decision_function(x_test),
                               rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(probe.ridge_predict(fit, x_test), ref.predict(x_test))
    assert list(classes) == list(ref.classes_)


def test_ridge_by_hand():
    """x = 0, 1, 2, 3 with labels 0, 0, 1, 1, standardised: z = (x − 1.5)/√1.25, Σz² = 4, targets ±1 with mean 0,
    so w = Σ z·t / (Σz² + α) = (4/√1.25) / 5 and b = 0: the boundary is x = 1.5."""
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    z = (x - 1.5) / math.sqrt(1.25)
    classes, w, b = probe.ridge_fit(z, np.array([0, 0, 1, 1]))
    assert list(classes) == [0, 1]
    assert w[0, 0] == pytest.approx(4 / math.sqrt(1.25) / 5, rel=1e-12)
    assert abs(b[0]) < 1e-12
    tests = (np.array([[1.4], [1.6], [-5.0], [9.0]]) - 1.5) / math.sqrt(1.25)
    assert list(probe.ridge_predict((classes, w, b), tests)) == [0, 1, 0, 1]


class _Linear(torch.nn.Module):
    """features(x) = x W: a fixed feature map (some features constant, as dead ReLUs are)."""

    def __init__(self, d_in, d_out, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(d_in, d_out, generator=g))
        with torch.no_grad():
            self.w[:, :3] = 0.0

    def features(self, x):
        return x @ self.w


def _task(n_train, n_test, d, k, seed):
    x, y = _data(n_train, d, k, seed)
    xt, yt = _data(n_test, d, k, seed + 1)
    return Task(0, tuple(range(3, 3 + k)), torch.tensor(x, dtype=torch.float32), torch.tensor(y),
                torch.tensor(xt, dtype=torch.float32), torch.tensor(yt))


@pytest.mark.parametrize("k", [2, 3])
def test_probe_accuracy_is_the_ridge_classifiers_on_standardised_features(k):
    task = _task(2500, 211, 16, k, seed=k)  # more than MAX_TRAIN: the strided subsample
    model = _Linear(16, 12)
    model.train()
    acc = probe.probe_accuracy(model, task, torch.device("cpu"))
    assert model.training  # the mode is put back
    idx = np.linspace(0, 2499, probe.MAX_TRAIN).round().astype(int)
    with torch.no_grad():
        f = model.features(task.x_train[torch.as_tensor(idx)]).double().numpy()
        ft = model.features(task.x_test).double().numpy()
    mean, std = f.mean(0), f.std(0) + 1e-8
    ref = RidgeClassifier(alpha=1.0).fit((f - mean) / std, task.y_train.numpy()[idx])
    expected = float((ref.predict((ft - mean) / std) == task.y_test.numpy()).mean())
    assert acc == expected
    assert 0.5 < acc <= 1.0


def test_probe_is_none_where_it_cannot_measure_and_off_when_disabled(monkeypatch):
    model = _Linear(4, 5)
    one_class = Task(0, (0, 1), torch.zeros(6, 4), torch.zeros(6, dtype=torch.long), torch.zeros(2, 4),
                     torch.tensor([0, 1]))
    assert probe.probe_accuracy(model, one_class, torch.device("cpu")) is None
    no_test = Task(0, (0, 1), torch.randn(6, 4), torch.tensor([0, 1] * 3), torch.zeros(0, 4),
                   torch.zeros(0, dtype=torch.long))
    assert probe.probe_accuracy(model, no_test, torch.device("cpu")) is None
    monkeypatch.setattr(probe, "ENABLED", False)
    assert probe.probe_accuracy(model, _task(50, 20, 4, 2, 0), torch.device("cpu")) is None


def test_the_version_1_probe_is_the_logistic_regression():
    """`logistic_accuracy` (kept for benchmarks/probe_agreement.py) is sklearn's LogisticRegression on the
    same standardised features; on well-separated data both probes agree."""
    from sklearn.linear_model import LogisticRegression

    task = _task(400, 150, 16, 2, seed=7)
    feats = probe.probe_features(_Linear(16, 12), task, torch.device("cpu"))
    x, y, xt, yt = feats
    ref = LogisticRegression(max_iter=1000).fit(x, y)
    assert probe.logistic_accuracy(*feats) == float((ref.predict(xt) == yt).mean())
    assert abs(probe.logistic_accuracy(*feats) - probe.probe_accuracy(_Linear(16, 12), task, "cpu")) < 0.05


def test_records_carry_the_checks_version():
    from harness.config.pretrain import Pretrain
    from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec
    from harness.run.engine import run_one

    spec = RunSpec(protocol="t", protocol_version="1", dataset=DatasetSpec("digits", 2, 2, "mlp"), regime="full",
                   method="naive", label="", hparams={}, order=0, class_order=tuple(range(10)), seed=0,
                   scenario="task-il", pretrain=Pretrain("first-task"),
                   training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=64), eval_batch_size=1024)
    rec = run_one(spec, device="cpu")
    assert rec.ok and rec.checks["version"] == checks.CHECKS_VERSION == 2
    assert all(0.5 <= p <= 1.0 for p in rec.checks["probe_acc"])
