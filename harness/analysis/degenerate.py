"""Degenerate regimes: every method scores the same, so a ranking there says nothing.

Example: `head` under task-IL with first-task pretraining, where most methods only differ
in how they treat the shared body, which does not train. Such a regime is shown, and left
out of tau, W and the headline with its reason.

"The same" has two tolerances: identical within TOLERANCE in every task order, or every pair
of methods practically equal by the Bayesian signed-rank test (P(within the ROPE) >= CREDIBLE):
a ranking of methods that are credibly equivalent is noise, whatever its tau.
"""
from __future__ import annotations

import pandas as pd

from harness.analysis.bayes import CREDIBLE
from harness.analysis.coverage import Cells, complete
from harness.analysis.frame import percent_scale

TOLERANCE = 1e-6  # in accuracy fractions; scaled when records store percents


def tie_groups(om: pd.DataFrame, tol: float) -> list[list[str]]:
    """Methods whose per-order scores all lie within tol of the group's first method, largest first."""
    left, groups = list(om.columns), []
    while left:
        head = om[left[0]]
        same = [m for m in left if (om[m] - head).abs().max() <= tol]
        groups.append(same)
        left = [m for m in left if m not in same]
    return sorted(groups, key=len, reverse=True)


def _all_equal(bayes: pd.DataFrame | None, dataset: str, regime: str, n_methods: int) -> bool:
    """Whether the Bayesian table decides every pair of the cell's methods 'equal'."""
    if bayes is None or bayes.empty or n_methods < 2:
        return False
    sub = bayes[(bayes["dataset"] == dataset) & (bayes["regime"] == regime)]
    return len(sub) == n_methods * (n_methods - 1) // 2 and bool((sub["decision"] == "equal").all())


def degenerate_table(frame: pd.DataFrame, cells: Cells, tolerance: float = TOLERANCE,
                     bayes: pd.DataFrame | None = None, rope_points: float | None = None) -> pd.DataFrame:
    """Per (dataset, regime): whether every complete method ties (identically, or practically by
    the Bayesian table when given), the largest identical group, and why."""
    tol = tolerance * (1.0 if percent_scale(frame) == 100.0 else 100.0)
    rows = []
    for ds in cells.datasets:
        for rg in cells.regimes(ds):
            keep, _ = complete(cells.mat(ds, rg))
            om = cells.orders(ds, rg, keep)
            groups = tie_groups(om, tol) if keep else []
            largest = groups[0] if groups else []
            spread = float((om.max(axis=1) - om.min(axis=1)).max()) if keep else float("nan")
            identical = len(keep) >= 2 and len(largest) == len(keep)
            equivalent = not identical and _all_equal(bayes, ds, rg, len(keep))
            degenerate = identical or equivalent
            reason = (f"all {len(keep)} methods score within {tol:g} of each other in every task order" if identical
                      else f"every pair of the {len(keep)} methods is practically equal (Bayesian signed-rank, "
                           f"ROPE {rope_points:g} ACC point{'' if rope_points == 1 else 's'}, P >= {CREDIBLE:g})"
                           if equivalent else "")
            rows.append({"dataset": ds, "regime": rg, "n_methods": len(keep), "degenerate": degenerate,
                         "largest_tie": len(largest), "tied": ", ".join(largest) if len(largest) > 1 else "",
                         "spread": spread, "reason": reason})
    return pd.DataFrame(rows, columns=["dataset", "regime", "n_methods", "degenerate", "largest_tie",
                                       "tied", "spread", "reason"])


def degenerate_regimes(table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """{dataset: {regime: reason}} of the degenerate cells."""
    out: dict[str, dict[str, str]] = {}
    for row in table[table["degenerate"]].itertuples():
        out.setdefault(row.dataset, {})[row.regime] = row.reason
    return out
