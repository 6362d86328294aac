"""A linear probe on a model's own features: how well the features separate one task's classes."""
from __future__ import annotations

import numpy as np
import torch

MAX_TRAIN = 2000  # probe fitted on at most this many training samples (evenly strided)
# Benchmarks switch it off in-process to time the harness without its learning checks' probe
# (a run without it records no probe accuracy and cannot be flagged `below-probe`).
ENABLED = True


@torch.no_grad()
def _features(model, x: torch.Tensor, device, batch_size: int) -> np.ndarray:
    parts = [model.features(x[i:i + batch_size].to(device)).double().cpu()
             for i in range(0, len(x), batch_size)]
    return torch.cat(parts).flatten(1).numpy()


def probe_accuracy(model, task, device, batch_size: int = 1024) -> float | None:
    """Test accuracy of a logistic regression fitted on `model.features` of the task's training data.

    None when the task has fewer than two classes in its training data, no test data, or the
    features are not finite (the probe measures; it never fails a run). The probe is
    deterministic (lbfgs, standardised features, sklearn's default L2).
    """
    if not ENABLED:
        return None
    from sklearn.linear_model import LogisticRegression

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
    clf = LogisticRegression(max_iter=1000).fit((f_train - mean) / std, y_train[idx])
    return float((clf.predict((f_test - mean) / std) == y_test).mean())
