"""Per-run metrics from the accuracy matrix (specs/metrics.md), as pure functions."""
from __future__ import annotations

import numpy as np


def acc(R: np.ndarray) -> float:
    """Final average accuracy: mean of the last row."""
    return float(np.mean(R[-1]))


def la(R: np.ndarray) -> float:
    """Learning accuracy (plasticity): mean of the diagonal."""
    return float(np.mean(np.diag(R)))


def bwt(R: np.ndarray) -> float:
    """Backward transfer: mean over j<T of R[T][j] - R[j][j]."""
    T = len(R)
    if T < 2:
        return 0.0
    return float(np.mean([R[-1, j] - R[j, j] for j in range(T - 1)]))


def forgetting(R: np.ndarray) -> float:
    """Chaudhry et al. (2018): mean over j<T of max_{j<=l<T} R[l][j] - R[T][j]."""
    T = len(R)
    if T < 2:
        return 0.0
    return float(np.mean([R[j:T - 1, j].max() - R[-1, j] for j in range(T - 1)]))


def fwt(R: np.ndarray, init: np.ndarray) -> float:
    """Forward transfer: mean over j>=2 of R[j-1][j] - b_j."""
    T = len(R)
    if T < 2:
        return 0.0
    return float(np.mean([R[j - 1, j] - init[j] for j in range(1, T)]))


def aia(R: np.ndarray) -> float:
    """Average incremental accuracy: mean over k of the mean of R[k][:k]."""
    return float(np.mean([np.mean(R[k, :k + 1]) for k in range(len(R))]))


def step_forgetting(R: np.ndarray) -> list:
    """f_t = mean_{j<t} (R[t-1][j] - R[t][j]) for t >= 2; None for t = 1."""
    return [None] + [float(np.mean(R[t - 1, :t] - R[t, :t])) for t in range(1, len(R))]


def all_metrics(acc_matrix, init_acc) -> dict:
    """The six summary metrics of a complete T x T accuracy matrix."""
    R = np.asarray(acc_matrix, dtype=float)
    b = np.asarray(init_acc, dtype=float)
    if R.ndim != 2 or R.shape[0] != R.shape[1]:
        raise ValueError(f"accuracy matrix must be square, got shape {R.shape}")
    return {"acc": acc(R), "la": la(R), "bwt": bwt(R), "forgetting": forgetting(R),
            "fwt": fwt(R, b), "aia": aia(R)}
