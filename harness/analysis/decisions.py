"""Pairwise Bayesian decisions per regime, and the rank reversals they make credible.

Blocks are task orders (seeds averaged within an order), paired across methods exactly as
the rank statistics pair them (coverage rules in coverage.py). Across data sets (`(all)`)
the blocks of every data set are pooled: one signed-rank test over all (dataset, order)
pairs for the methods complete on every data set.
"""
from __future__ import annotations

import itertools

import pandas as pd

from harness.analysis import bayes
from harness.analysis.coverage import Cells

ALL = "(all)"
ROPE_POINTS = 1.0  # region of practical equivalence, in ACC points
BAYES_COLUMNS = ["dataset", "regime", "method_1", "method_2", "n_blocks", "diff", "p_1",
                 "p_rope", "p_2", "rope", "decision"]
REVERSAL_COLUMNS = ["dataset", "method_1", "method_2", "regime_a", "regime_b", "diff_a",
                    "diff_b", "p_a", "p_b", "strength"]


def rope_fraction(rope_points: float, scale: float) -> float:
    """The ROPE on the scale accuracies are stored in (scale = 100 for fractions)."""
    return rope_points / scale


def _pairs(om: pd.DataFrame, dataset: str, regime: str, rope: float, seed: int) -> list[dict]:
    # Too few blocks to ever call a winner: decide nothing. The prior's pseudo-observation sits
    # at 0, inside the ROPE, so one block of ties would otherwise read "equal" with P = 1.
    can_decide = bayes.max_attainable(len(om), rope) >= bayes.CREDIBLE
    rows = []
    for a, b in itertools.combinations(sorted(om.columns), 2):
        p1, pr, p2 = bayes.signed_rank_probs(om[a].to_numpy(), om[b].to_numpy(), rope, seed=seed)
        rows.append({"dataset": dataset, "regime": regime, "method_1": a, "method_2": b,
                     "n_blocks": len(om), "diff": float((om[a] - om[b]).mean()), "p_1": p1,
                     "p_rope": pr, "p_2": p2, "rope": rope,
                     "decision": bayes.decision(p1, pr, p2) if can_decide else "undecided"})
    return rows


def pooled_blocks(cells: Cells, regime: str) -> pd.DataFrame:
    """(dataset, order) x method scores of one regime, for methods complete on every dataset.

    Pooled, not hierarchical: the orders of one data set are treated as exchangeable with
    those of another (baycomp's hierarchical test needs Stan; see the README).
    """
    dss = [ds for ds in cells.datasets if regime in cells.regimes(ds)]
    keep = None
    for ds in dss:
        full = set(cells.complete_across(ds, [regime])[0])
        keep = full if keep is None else keep & full
    keep = sorted(keep or [])
    if len(dss) < 2 or len(keep) < 2:
        return pd.DataFrame()
    return pd.concat([cells.orders(ds, regime, keep) for ds in dss], ignore_index=True)


def bayes_table(cells: Cells, rope: float, seed: int = bayes.SEED) -> pd.DataFrame:
    """P(method_1 better), P(equal), P(method_2 better) per pair, per (dataset, regime) and pooled."""
    rows = []
    for ds in cells.datasets:
        for rg in cells.regimes(ds):
            keep, _ = cells.complete_across(ds, [rg])
            if len(keep) >= 2:
                rows += _pairs(cells.orders(ds, rg, keep), ds, rg, rope, seed)
    for rg in cells.regime_order:
        om = pooled_blocks(cells, rg)
        if not om.empty:
            rows += _pairs(om, ALL, rg, rope, seed)
    return pd.DataFrame(rows, columns=BAYES_COLUMNS)


def _winner(row) -> int:
    """+1 when method_1 is credibly better, -1 when method_2 is, 0 otherwise."""
    return {"method_1": 1, "method_2": -1}.get(row["decision"], 0)


def credible_reversals(table: pd.DataFrame, regime_order, skip: dict | None = None) -> pd.DataFrame:
    """Pairs credibly ordered one way in one regime and the other way in another (strongest first).

    skip: {dataset: {regime: reason}} regimes left out (degenerate ones).
    """
    skip = skip or {}
    pos = {r: i for i, r in enumerate(regime_order)}
    rows = []
    for (ds, m1, m2), sub in table.groupby(["dataset", "method_1", "method_2"], sort=True):
        decided = [r for _, r in sub.iterrows() if _winner(r) and r["regime"] not in skip.get(ds, {})]
        decided.sort(key=lambda r: pos.get(r["regime"], len(pos)))
        for a, b in itertools.combinations(decided, 2):
            if _winner(a) != _winner(b):
                pa = a["p_1"] if _winner(a) > 0 else a["p_2"]
                pb = b["p_1"] if _winner(b) > 0 else b["p_2"]
                rows.append({"dataset": ds, "method_1": m1, "method_2": m2, "regime_a": a["regime"],
                             "regime_b": b["regime"], "diff_a": a["diff"], "diff_b": b["diff"],
                             "p_a": pa, "p_b": pb, "strength": min(pa, pb)})
    out = pd.DataFrame(rows, columns=REVERSAL_COLUMNS)
    return out.sort_values(["strength", "dataset"], ascending=[False, True], kind="stable").reset_index(drop=True)
