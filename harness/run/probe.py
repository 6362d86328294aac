"""A linear probe on a model's own features: how well the features separate one task's classes.

The probe of checks version 2 (harness/run/checks.py CHECKS_VERSION) is a ridge (least-squares)
classifier in closed form: on the standardised features of the task's training data, targets ±1
per class (one column for two classes), L2 penalty `RIDGE_ALPHA` on the weights, intercept free —
scikit-learn's `RidgeClassifier(alpha=1.0)` on the same standardised features, solved as one linear
system (the smaller of the primal d×d and the dual n×n one), in numpy alone. It replaces the
logistic regression of version 1 (`logistic_accuracy`: scikit-learn's LogisticRegression, lbfgs,
C = 1, up to 1000 iterations), whose fit cost ~2–5 ms a task, most of the per-run fixed cost of
a ~0.3 s run, for a fit of ~0.5 ms (what is left is the pass over the task's data for the features).
Both are linear probes on the same features; they are not the same number. On the demo's 1750
probed tasks (depth-sweep-mini v5, 350 runs) the ridge probe minus the logistic one: mean −0.0006,
mean |difference| 0.0056, largest 0.045, equal on 55 %; 8 of 47 `below-probe` warnings moved (4
lost, 4 gained), each a gap within 3.5 points of the 10-point line (docs/small-grids.md).
"""
from __future__ import annotations

import numpy as np
import torch

MAX_TRAIN = 2000  # probe fitted on at most this many training samples (evenly strided)
RIDGE_ALPHA = 1.0  # the ridge penalty (scikit-learn RidgeClassifier's default)
# Benchmarks switch it off in-process to time the harness without its learning checks' probe
# (a run without it records no probe accuracy and cannot be flagged `below-probe`).
ENABLED = True


@torch.no_grad()
def _features(model, x: torch.Tensor, device, batch_size: int) -> np.ndarray:
    # joined on the device, one copy to the host (float32 -> float64 is exact wherever it is done)
    parts = [model.features(x[i:i + batch_size].to(device)) for i in range(0, len(x), batch_size)]
    return torch.cat(parts).double().cpu().flatten(1).numpy()


def probe_features(model, task, device, batch_size: int = 1024):
    """(standardised train features, train labels, standardised test features, test labels) of the
    trained model on one task, or None when the task has fewer than two classes in its training data,
    no test data, or the features are not finite (the probe measures; it never fails a run).

    At most MAX_TRAIN training samples, evenly strided; standardised with the training features' mean
    and standard deviation (+1e-8: a constant feature stays 0)."""
    y_train, y_test = task.y_train.cpu().numpy(), task.y_test.cpu().numpy()  # resident on a GPU, maybe
    if len(np.unique(y_train)) < 2 or len(y_test) == 0:
        return None
    idx = np.linspace(0, len(y_train) - 1, min(MAX_TRAIN, len(y_train))).round().astype(int)
    was_training = model.training
    model.eval()
    try:
        f_train = _features(model, task.x_train[torch.as_tensor(idx)], device, batch_size)
        f_test = _features(model, task.x_test, device, batch_size)
    finally:
        model.train(was_training)
    if not (np.isfinite(f_train).all() and np.isfinite(f_test).all()):
        return None
    mean, std = f_train.mean(0), f_train.std(0) + 1e-8
    return (f_train - mean) / std, y_train[idx], (f_test - mean) / std, y_test


def probe_accuracy(model, task, device, batch_size: int = 1024) -> float | None:
    """Test accuracy of the ridge probe (`ridge_fit`) fitted on `model.features` of the task's training data.

    None where `probe_features` is None. Deterministic (one linear solve)."""
    if not ENABLED:
        return None
    feats = probe_features(model, task, device, batch_size)
    if feats is None:
        return None
    x_train, y_train, x_test, y_test = feats
    return float((ridge_predict(ridge_fit(x_train, y_train), x_test) == y_test).mean())


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float = RIDGE_ALPHA) -> tuple:
    """(classes, W, b) minimising ||x W + b − Y||² + alpha ||W||², Y the ±1 targets of `y`'s classes
    (one column, the second class's, for two classes; one per class otherwise), b unpenalised.

    The primal system (Xcᵀ Xc + αI) W = Xcᵀ Yc for d ≤ n features, else the dual W = Xcᵀ (Xc Xcᵀ + αI)⁻¹ Yc
    (the same W), Xc, Yc centred."""
    x = np.asarray(x, dtype=np.float64)
    classes, codes = np.unique(y, return_inverse=True)
    targets = np.where(codes[:, None] == np.arange(len(classes))[None], 1.0, -1.0)
    if len(classes) == 2:
        targets = targets[:, 1:]
    x_mean, y_mean = x.mean(0), targets.mean(0)
    xc, yc = x - x_mean, targets - y_mean
    n, d = xc.shape
    if d <= n:
        gram = xc.T @ xc
        gram[np.diag_indices(d)] += alpha
        w = np.linalg.solve(gram, xc.T @ yc)
    else:
        gram = xc @ xc.T
        gram[np.diag_indices(n)] += alpha
        w = xc.T @ np.linalg.solve(gram, yc)
    return classes, w, y_mean - x_mean @ w


def ridge_predict(fit: tuple, x: np.ndarray) -> np.ndarray:
    """The class of each row of `x` under a `ridge_fit`: the second class where its score is > 0 (two
    classes), else the highest-scoring class (the first of a tie)."""
    classes, w, b = fit
    scores = np.asarray(x, dtype=np.float64) @ w + b
    if len(classes) == 2:
        return classes[(scores[:, 0] > 0).astype(int)]
    return classes[scores.argmax(1)]


def logistic_accuracy(x_train, y_train, x_test, y_test) -> float:
    """The probe of checks version 1 on `probe_features`' output: scikit-learn's LogisticRegression
    (lbfgs, C = 1, max_iter 1000). Kept to compare the two (benchmarks/probe_agreement.py); no run uses it."""
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=1000).fit(x_train, y_train)
    return float((clf.predict(x_test) == y_test).mean())
