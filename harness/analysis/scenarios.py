"""Does the scenario reorder methods as much as the regime does?

A class-IL record carries two views of the same runs: the class-IL accuracy (argmax over every
class seen) and the task-aware one (argmax within the task's own classes, the task-IL question).
Per (dataset, regime), Kendall tau_b between the method rankings by the two (mean ACC over task
orders, the methods complete in both, permutation p as between regimes: ranks.regime_agreement)
says how much the scenario reorders methods; beside it, the tau between this regime's class-IL
ranking and every other regime's (the regime-pair taus of the class-IL records) says how much the
regime does. A pooled row per dataset (regime `(all)`) gives the mean of each, with a percentile
bootstrap CI over regimes (scenario) and regime pairs (regime), read as descriptive (pairs share
regimes), as families.py does. Degenerate regimes (every method ties in class-IL) have no tau.
"""
from __future__ import annotations

import math

import pandas as pd

from harness.analysis import stats
from harness.analysis.coverage import Cells, complete
from harness.analysis.ranks import mean_acc
from harness.config.text import terminal_safe
from harness.config.vocabulary import Scenario

ALL = "(all)"  # the pooled row of a dataset
TASK_AWARE = "acc_task_aware"
COLUMNS = ["dataset", "regime", "tau", "tau_lo", "tau_hi", "p", "n_methods", "excluded", "note",
           "regime_tau", "regime_tau_lo", "regime_tau_hi", "regime_tau_min", "n_regime_pairs"]


def scenario_agreement(frame: pd.DataFrame, tau: pd.DataFrame, cells: Cells | None = None,
                       seed: int = stats.SEED, skip: dict | None = None) -> pd.DataFrame:
    """Per (dataset, regime) of the class-IL runs: tau_b between the task-aware and the class-IL
    ranking, beside the regime-pair taus (`tau`: ranks.regime_agreement of the same runs); see the
    module docstring. Empty without class-IL runs carrying a task-aware ACC."""
    cil = frame[frame["scenario"] == Scenario.CLASS_IL] if "scenario" in frame else frame.iloc[:0]
    if cil.empty or not cil[TASK_AWARE].notna().any():
        return pd.DataFrame(columns=COLUMNS)
    c = cells if cells is not None and len(frame) == len(cil) else Cells(cil)
    aware = Cells(cil, metric=TASK_AWARE)
    rows = []
    for ds in c.datasets:
        per = [_regime_row(c, aware, tau, ds, rg, (skip or {}).get(ds, {}), seed) for rg in c.regimes(ds)]
        rows += per + [_pooled_row(ds, per, tau, seed)]
    return pd.DataFrame(rows, columns=COLUMNS)


def _regime_row(c: Cells, aware: Cells, tau: pd.DataFrame, ds: str, rg: str, left_out: dict, seed: int) -> dict:
    """One regime: the scenario tau (methods complete in both views) and this regime's regime-pair taus."""
    keep_cil, out_cil = complete(c.mat(ds, rg))
    keep_ta, out_ta = complete(aware.mat(ds, rg))
    keep = sorted(set(keep_cil) & set(keep_ta))
    excluded = sorted((set(out_cil) | set(out_ta)) - set(keep))
    t, p, note = math.nan, math.nan, ""
    if rg in left_out:
        note = f"{rg} left out: {left_out[rg]}"
    elif len(keep) < 2:
        note = "fewer than 2 methods complete in both views"
    else:
        t, p = stats.tau_permutation_test(mean_acc(aware, ds, rg, keep).to_numpy(),
                                          mean_acc(c, ds, rg, keep).to_numpy(), seed=seed)
    others = _pair_taus(tau, ds, rg)
    return {"dataset": ds, "regime": rg, "tau": t, "tau_lo": math.nan, "tau_hi": math.nan, "p": p,
            "n_methods": len(keep), "excluded": ", ".join(excluded), "note": note,
            "regime_tau": float(others.mean()) if len(others) else math.nan,
            "regime_tau_lo": math.nan, "regime_tau_hi": math.nan,
            "regime_tau_min": float(others.min()) if len(others) else math.nan, "n_regime_pairs": len(others)}


def _pair_taus(tau: pd.DataFrame, ds: str, rg: str | None = None) -> pd.Series:
    """The finite taus between two distinct regimes of a dataset: those with `rg`, or each pair once."""
    sub = tau[(tau["dataset"] == ds) & (tau["regime_a"] != tau["regime_b"]) & tau["tau"].notna()]
    sub = sub[sub["regime_a"] == rg] if rg is not None else sub[sub["regime_a"] < sub["regime_b"]]
    return sub["tau"].astype(float)


def _pooled_row(ds: str, per: list[dict], tau: pd.DataFrame, seed: int) -> dict:
    """A dataset's mean scenario tau over its regimes and mean regime-pair tau over its pairs, with CIs."""
    scen = [r["tau"] for r in per if not math.isnan(r["tau"])]
    pairs = _pair_taus(tau, ds).tolist()
    t, t_lo, t_hi = _mean_ci(scen, seed)
    r, r_lo, r_hi = _mean_ci(pairs, seed)
    return {"dataset": ds, "regime": ALL, "tau": t, "tau_lo": t_lo, "tau_hi": t_hi, "p": math.nan,
            "n_methods": max((r["n_methods"] for r in per), default=0), "excluded": "",
            "note": f"mean over {len(scen)} regime{'' if len(scen) == 1 else 's'}",
            "regime_tau": r, "regime_tau_lo": r_lo, "regime_tau_hi": r_hi,
            "regime_tau_min": min(pairs) if pairs else math.nan, "n_regime_pairs": len(pairs)}


def _mean_ci(values: list, seed: int) -> tuple[float, float, float]:
    """Mean and percentile bootstrap CI; no CI from a single value (nothing to resample), NaNs without any."""
    if not values:
        return math.nan, math.nan, math.nan
    if len(values) == 1:
        return float(values[0]), math.nan, math.nan
    return stats.bootstrap_mean(values, seed=seed)


def scenario_lines(table: pd.DataFrame) -> list[str]:
    """The terminal summary's lines: per dataset, the mean scenario tau beside the mean regime tau."""
    pooled = table[table["regime"] == ALL] if len(table) else table
    if pooled.empty:
        return []
    lines = ["does the scenario reorder methods as much as the regime does? (class-IL runs; Kendall tau_b "
             "of the method rankings by mean ACC)"]
    for r in pooled.itertuples():
        per = table[(table["dataset"] == r.dataset) & (table["regime"] != ALL)]
        each = ", ".join(f"{p.regime} {_num(p.tau)}" if not math.isnan(p.tau) else f"{p.regime} n/a ({_why(p)})"
                         for p in per.itertuples())
        lines.append(terminal_safe(f"  {r.dataset}: task-aware vs class-IL ranking, same runs: {_num(r.tau)}"
                     f"{f' ({each})' if each else ''}; between regimes: {_num(r.regime_tau)} "
                     f"over {r.n_regime_pairs} regime pair{'' if r.n_regime_pairs == 1 else 's'}"))
    return lines


def _why(row) -> str:
    """Why a regime has no scenario tau, in a few words (the table's note says it in full)."""
    return "left out, degenerate" if " left out: " in row.note else "fewer than 2 complete methods"


def _num(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}"
