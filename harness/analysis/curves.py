"""Accuracy-vs-task curves: after training task t, the mean accuracy on tasks 1..t."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.analysis import stats

COLUMNS = ["dataset", "regime", "method", "task", "n", "acc", "acc_lo", "acc_hi"]


def seen_task_accuracy(matrix) -> list[float]:
    """a_t = mean_{j <= t} R[t][j] for every row t of an accuracy matrix (NaN where cells are missing)."""
    out = []
    for t, row in enumerate(matrix or []):
        vals = [v for v in (row or [])[:t + 1] if isinstance(v, (int, float)) and math.isfinite(v)]
        out.append(float(np.mean(vals)) if len(vals) == t + 1 else math.nan)
    return out


def task_curves(records, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, regime, method, task): mean a_t over ok runs with a bootstrap CI over runs.

    Like the metric tables (and unlike the rankings), flagged runs are included: a curve shows
    what was measured, the flag marks say where.
    """
    groups: dict[tuple, list[list[float]]] = {}
    for rec in records:
        if rec.ok and rec.acc_matrix:
            key = (rec.dataset, rec.spec.regime, rec.method)
            groups.setdefault(key, []).append(seen_task_accuracy(rec.acc_matrix))
    rows = []
    for (ds, rg, m), curves in sorted(groups.items()):
        width = max(len(c) for c in curves)
        X = np.array([c + [math.nan] * (width - len(c)) for c in curves])
        mean, lo, hi = stats.bootstrap_means(X, seed=seed)
        n = np.isfinite(X).sum(axis=0)
        rows += [{"dataset": ds, "regime": rg, "method": m, "task": t + 1, "n": int(n[t]),
                  "acc": mean[t], "acc_lo": lo[t], "acc_hi": hi[t]} for t in range(width)]
    return pd.DataFrame(rows, columns=COLUMNS)
