"""Any-time tables: mean continual-evaluation curves around task boundaries, rankings by min-ACC,
WC-ACC and A_AUC next to ACC (and tau between them), and the stability gap against the regime.

Pure functions over records and the tidy frame (frame.py, whose ANYTIME_NAMES columns hold each
run's any-time metrics, config/metrics.py ANYTIME). Every table has its columns when no run has a
curve, and no rows. Sources and definitions: docs/metrics-anytime.md.

Alignment of runs (`curves`): a run's points are put in slots (task, offset into the task) for the
points taken during training, and (task, end) for the task's end point, whatever its step. Mid-task
points sit at multiples of the protocol's `every` into their task, so the same offset is the same
amount of training in every run; the end point is the task's last step, which differs between
runs whose task orders give tasks of different sizes (digits: a step more or less), so end points
are aligned with each other, not by offset. A run whose task is shorter lacks the last mid-task
slots there (n counts the runs in each slot).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from harness.analysis import stats
from harness.analysis.coverage import Cells, complete
from harness.analysis.frame import ok_runs, regime_order
from harness.analysis.ranks import mean_acc
from harness.config.anytime import curve_from_record
from harness.config.vocabulary import Status

CURVE_COLUMNS = ["dataset", "regime", "method", "task", "point", "offset", "end", "x", "n",
                 "old_acc", "old_acc_lo", "old_acc_hi", "seen_acc", "seen_acc_lo", "seen_acc_hi",
                 "first_acc", "first_acc_lo", "first_acc_hi"]
RANKED = ("acc", "min_acc", "wc_acc", "a_auc")  # all higher is better
RANK_COLUMNS = ["dataset", "regime", "method", "n", *[c for m in RANKED for c in (m, f"{m}_rank")]]
TAU_COLUMNS = ["dataset", "regime", "n_methods", *[c for m in RANKED[1:] for c in (f"tau_{m}", f"p_{m}")]]
TREND_COLUMNS = ["dataset", "method", "n_regimes", "rho_fraction", "p_fraction", "n_runs", "rho_norm", "p_norm",
                 "rho_runs", "p_runs", "trend"]
QUANTITIES = ("old_acc", "seen_acc", "first_acc")
END = "end"  # slot key of a task's end point


def _mean(values) -> float:
    if any(v is None for v in values) or not values:
        return math.nan
    return float(sum(values) / len(values))


def run_points(curve: dict) -> tuple[dict, list[int]]:
    """One run's curve as {(task, slot): (old_acc, seen_acc, first_acc)} and its task lengths in steps.

    task is 0-based here; slot is the offset (steps into the task) of a point taken during training,
    or END for the task's end point. old_acc: mean accuracy over tasks j < task (NaN for task 0);
    seen_acc: over j <= task; first_acc: task 0's. NaN where a value it needs is missing.
    """
    c = curve_from_record(curve, keep_shadowed=True)  # the chart shows both points of a shared step
    lengths = [b - a for a, b in c.bounds]
    out = {}
    for p, (step, task, end) in enumerate(zip(curve["steps"], curve["task"], curve["end"])):
        row = [c.value(p, j) for j in range(task + 1)]
        slot = END if end else int(step) - c.bounds[task][0]
        out[(int(task), slot)] = (_mean(row[:task]) if task else math.nan, _mean(row),
                                  math.nan if row[0] is None else float(row[0]))
    return out, lengths


def _slot_order(slot) -> tuple:
    return (1, 0) if slot == END else (0, slot)


def curves(records, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, regime, method, task, point): mean old / seen / first-task accuracy over the ok
    runs with a curve, with bootstrap CIs over runs (like curves.task_curves; flagged runs included).

    task is 1-based; point the 0-based ordinal of the slot within its task (end point last); offset
    the slot's steps into the task (for the end point: the median task length); x = (task - 1) +
    offset / (median length of the task), clipped to the task's end, so boundaries sit at integers.
    Task 1's first point is the run's start (step 0, x = 0).
    """
    groups: dict[tuple, list] = {}
    for rec in records:
        if rec.status == Status.OK and rec.curve is not None:
            groups.setdefault((rec.dataset, rec.spec.regime, rec.method), []).append(run_points(rec.curve))
    rows = []
    for (ds, rg, m), runs in sorted(groups.items()):
        slots = sorted({s for pts, _ in runs for s in pts}, key=lambda s: (s[0], *_slot_order(s[1])))
        n_tasks = max(len(lengths) for _, lengths in runs)
        median_len = [float(np.median([lg[t] for _, lg in runs if len(lg) > t])) for t in range(n_tasks)]
        cube = np.array([[pts.get(s, (math.nan,) * 3) for s in slots] for pts, _ in runs], float)
        est = [stats.bootstrap_means(cube[:, :, q], seed=seed) for q in range(len(QUANTITIES))]
        n = np.isfinite(cube[:, :, 1]).sum(axis=0)
        ordinal: dict[int, int] = {}
        for i, (task, slot) in enumerate(slots):
            point = ordinal[task] = ordinal.get(task, -1) + 1
            offset = median_len[task] if slot == END else float(slot)
            span = median_len[task]
            x = task + (min(offset / span, 1.0) if span > 0 else (1.0 if slot == END else 0.0))
            row = {"dataset": ds, "regime": rg, "method": m, "task": task + 1, "point": point, "offset": offset,
                   "end": slot == END, "x": float(x), "n": int(n[i])}
            for q, name in enumerate(QUANTITIES):
                mean, lo, hi = est[q]
                row.update({name: mean[i], f"{name}_lo": lo[i], f"{name}_hi": hi[i]})
            rows.append(row)
    return pd.DataFrame(rows, columns=CURVE_COLUMNS).astype({"end": bool})


def _with_curve(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["has_curve"].astype(bool)] if "has_curve" in frame else frame.iloc[:0]


def _kept(cells: dict, ds: str, rg: str) -> list[str]:
    """Methods complete (every ranked block) in each of the RANKED metrics' unit matrices."""
    keep = None
    for c in cells.values():
        full = set(complete(c.mat(ds, rg))[0])
        keep = full if keep is None else keep & full
    return sorted(keep or [])


def metric_cells(frame: pd.DataFrame) -> dict:
    """{metric: Cells} of the runs with a curve for each RANKED metric ({} when none has a curve)."""
    sub = _with_curve(frame)
    return {m: Cells(sub, metric=m) for m in RANKED} if len(sub) else {}


def ranks(frame: pd.DataFrame, cells: dict | None = None) -> pd.DataFrame:
    """Per (dataset, regime, method) of the ranked runs with a curve: mean ACC, min-ACC, WC-ACC and
    A_AUC over task orders and each one's mean rank (1 = best) over the task-order blocks (seeds
    averaged within an order, as ranks.mean_ranks does for ACC). The methods ranked are those with
    every block in all four (the same methods and runs for each metric); n = blocks."""
    cells = metric_cells(frame) if cells is None else cells
    rows = []
    for ds, rg in _cells_keys(cells):
        keep = _kept(cells, ds, rg)
        if not keep:
            continue
        block = {}
        for m, c in cells.items():
            om = c.orders(ds, rg, keep)
            block[m] = (om.mean(), pd.DataFrame(stats.rank_rows(om.to_numpy()), columns=om.columns).mean(), len(om))
        for meth in keep:
            row = {"dataset": ds, "regime": rg, "method": meth, "n": block["acc"][2]}
            for m in RANKED:
                row.update({m: float(block[m][0][meth]), f"{m}_rank": float(block[m][1][meth])})
            rows.append(row)
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def _cells_keys(cells: dict) -> list[tuple[str, str]]:
    if not cells:
        return []
    c = cells["acc"]
    return [(ds, rg) for ds in c.datasets for rg in c.regimes(ds)]


def tau(frame: pd.DataFrame, cells: dict | None = None, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, regime): Kendall tau_b between the methods' ranking by mean ACC and by mean
    min-ACC (WC-ACC, A_AUC), with the permutation p of ranks.regime_agreement (exact up to 8 methods).
    Does the end-of-task ranking hide the stability gap? tau near 1: no; low or negative: it reorders.
    NaN with fewer than two methods or a constant ranking (ties everywhere)."""
    cells = metric_cells(frame) if cells is None else cells
    rows = []
    for ds, rg in _cells_keys(cells):
        keep = _kept(cells, ds, rg)
        row = {"dataset": ds, "regime": rg, "n_methods": len(keep)}
        acc = mean_acc(cells["acc"], ds, rg, keep).to_numpy() if keep else np.array([])
        for m in RANKED[1:]:
            t, p = (stats.tau_permutation_test(acc, mean_acc(cells[m], ds, rg, keep).to_numpy(), seed=seed)
                    if len(keep) >= 2 else (math.nan, math.nan))
            row.update({f"tau_{m}": t, f"p_{m}": p})
        rows.append(row)
    return pd.DataFrame(rows, columns=TAU_COLUMNS)


def spearman_exact(x, y, seed: int = stats.SEED) -> tuple[float, float]:
    """Spearman rho and its two-sided permutation p (exact enumeration up to 8 points, else 10000
    seeded permutations): with a handful of regimes the t approximation's p means nothing
    (rho = 1 over 4 points gives p = 0; the exact p is 2/24). NaN with < 3 points or a constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan
    rx = sps.rankdata(x)

    def rho(yy, axis=-1):
        ry = sps.rankdata(yy, axis=axis)
        a, b = rx - rx.mean(), ry - ry.mean(axis=axis, keepdims=True)
        return (a * b).sum(axis=axis) / np.sqrt((a * a).sum() * (b * b).sum(axis=axis))

    exact = math.factorial(x.size) <= 40320
    res = sps.permutation_test((y,), rho, permutation_type="pairings", vectorized=True,
                               n_resamples=np.inf if exact else 10000, alternative="two-sided",
                               rng=np.random.default_rng(seed))
    return float(rho(y)), float(min(res.pvalue, 1.0))


def gap_trend(frame: pd.DataFrame, alpha: float = 0.05, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, method) of ok runs with a curve: does the stability gap grow with the trainable
    subspace?

    rho_fraction, p_fraction: Spearman of the per-regime mean gap depth against the regime's median
    trainable fraction (one point per regime; exact permutation p: spearman_exact). rho_runs, p_runs:
    the same over runs (each run's gap depth against its regime's fraction, ties within a regime;
    scipy's p). rho_norm, p_norm: Spearman over runs of gap depth against mean_update_norm. trend:
    "grows" / "shrinks" where the run-level p < alpha (the sign of rho_runs), else "no trend". The
    decision uses the runs because over 4 regimes the exact p of a perfect rho is 2/24 > 0.05.
    """
    ok = _with_curve(ok_runs(frame))
    ok = ok[ok["gap_depth"].notna()]
    order = {r: i for i, r in enumerate(regime_order(frame))}
    rows = []
    for (ds, m), sub in sorted(ok.groupby(["dataset", "method"]), key=lambda kv: kv[0]):
        fraction = frame[frame["dataset"] == ds].groupby("regime")["trainable_fraction"].median()
        per = sub.groupby("regime")["gap_depth"].mean()
        regs = sorted(per.index, key=lambda r: order.get(r, len(order)))
        fx = np.array([fraction.get(r, math.nan) for r in regs], float)
        known = np.isfinite(fx)
        rho_f, p_f = spearman_exact(fx[known], per[regs].to_numpy()[known], seed)
        run_fraction = sub["regime"].map(fraction).to_numpy(float)
        runs = stats.corr_with_ci(run_fraction, sub["gap_depth"].to_numpy(), n_boot=0)
        norm = stats.corr_with_ci(sub["mean_update_norm"].to_numpy(), sub["gap_depth"].to_numpy(), n_boot=0)
        rho_r, p_r = runs["rho"], runs["rho_p"]
        trend = ("grows" if rho_r > 0 else "shrinks") if p_r < alpha else "no trend"  # NaN < alpha is False
        rows.append({"dataset": ds, "method": m, "n_regimes": int(known.sum()), "rho_fraction": rho_f,
                     "p_fraction": p_f, "n_runs": len(sub), "rho_norm": norm["rho"], "p_norm": norm["rho_p"],
                     "rho_runs": rho_r, "p_runs": p_r, "trend": trend})
    return pd.DataFrame(rows, columns=TREND_COLUMNS)
