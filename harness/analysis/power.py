"""Design power: the smallest p (or the largest posterior probability) a test can reach.

A test over N paired blocks (task orders; seeds are averaged within an order) cannot go
below a floor set by N alone: the exact two-sided Wilcoxon signed-rank p is at least
2 / 2^N (5 orders: 0.0625, so nothing is ever significant at 0.05). Every test the
leaderboard shows is listed here with its floor, whether it can reach α at all, and how
many blocks it would need. Pure functions of the design; no data needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd
from scipy import stats as sps

from harness.analysis import bayes

ALPHA = 0.05
MAX_BLOCKS = 200  # search limit for "blocks needed"


class StatTest(StrEnum):
    """The tests the design-power table covers (a member is its string: the table's `test` column)."""

    WILCOXON_HOLM = "wilcoxon-holm"
    FRIEDMAN = "friedman"
    NEMENYI = "nemenyi"
    KENDALL_W = "kendall-w"
    KENDALL_TAU = "kendall-tau"
    BAYES_SIGNED_RANK = "bayes-signed-rank"


@dataclass(frozen=True)
class TestDesign:
    """What a test is applied to: blocks, items compared, simultaneous comparisons."""

    test: StatTest
    n_blocks: int
    n_items: int
    n_comparisons: int = 1

    def __post_init__(self):
        object.__setattr__(self, "test", StatTest(self.test))  # a misspelt name fails here, not as "no floor"


def wilcoxon_floor(n: int, comparisons: int = 1) -> float:
    """Smallest Holm-adjusted exact two-sided Wilcoxon p over n blocks: m · 2 / 2^n (capped at 1)."""
    return 1.0 if n < 1 or comparisons < 1 else min(1.0, comparisons * 2.0 ** (1 - n))


def friedman_floor(n: int, k: int) -> float:
    """Smallest Friedman p: every block ranks the k items the same way (chi2 = n (k - 1))."""
    # scipy's Friedman test needs 3 items (stats.friedman returns NaN below): never decides
    return 1.0 if n < 2 or k < 3 else float(sps.chi2.sf(n * (k - 1), k - 1))


def nemenyi_floor(n: int, k: int) -> float:
    """Smallest Nemenyi pairwise p: best vs worst in every block (mean-rank gap k - 1)."""
    if n < 1 or k < 2:
        return 1.0
    q = (k - 1) / math.sqrt(k * (k + 1) / (6.0 * n)) * math.sqrt(2.0)
    return float(sps.studentized_range.sf(q, k, np.inf))  # as scikit-posthocs computes it


def tau_floor(k: int) -> float:
    """Smallest two-sided exact permutation p of Kendall's tau over k distinct items: 2 / k!."""
    return 1.0 if k < 2 else min(1.0, 2.0 / math.factorial(k))


FLOORS = {
    StatTest.WILCOXON_HOLM: lambda d: wilcoxon_floor(d.n_blocks, d.n_comparisons),
    StatTest.FRIEDMAN: lambda d: friedman_floor(d.n_blocks, d.n_items),
    StatTest.NEMENYI: lambda d: nemenyi_floor(d.n_blocks, d.n_items),
    StatTest.KENDALL_W: lambda d: friedman_floor(d.n_blocks, d.n_items),  # same chi2, other blocks
    StatTest.KENDALL_TAU: lambda d: tau_floor(d.n_items),
}
WHAT = {
    StatTest.WILCOXON_HOLM: "paired Wilcoxon per method pair over task orders, Holm-corrected",
    StatTest.FRIEDMAN: "Friedman test of the methods over task orders",
    StatTest.NEMENYI: "Nemenyi post-hoc pairwise test after Friedman",
    StatTest.KENDALL_W: "Kendall's W of the method rankings across regimes",
    StatTest.KENDALL_TAU: "Kendall tau permutation test between two regimes' rankings",
    StatTest.BAYES_SIGNED_RANK: "Bayesian signed-rank test per method pair (ROPE)",
}
BLOCKS = {StatTest.KENDALL_W: "regimes", StatTest.KENDALL_TAU: "methods"}  # what N counts, when not orders


def floor(design: TestDesign) -> float:
    """Smallest attainable p of a frequentist test (NaN for the Bayesian one)."""
    f = FLOORS.get(design.test)
    return f(design) if f else math.nan


def max_probability(design: TestDesign, rope: float) -> float:
    """Largest posterior probability of the Bayesian test (NaN for the frequentist ones)."""
    return bayes.max_attainable(design.n_blocks, rope) if design.test == StatTest.BAYES_SIGNED_RANK else math.nan


def reachable(design: TestDesign, rope: float, alpha: float = ALPHA) -> bool:
    """Whether any data could make the test decide: p < alpha, or P >= the credible level."""
    if design.test == StatTest.BAYES_SIGNED_RANK:
        return max_probability(design, rope) >= bayes.CREDIBLE
    return floor(design) < alpha


def blocks_needed(design: TestDesign, rope: float, alpha: float = ALPHA) -> float:
    """The fewest blocks with which the test can decide (NaN when none up to MAX_BLOCKS)."""
    if design.test == StatTest.KENDALL_TAU:  # its floor depends on the items compared, not on blocks
        return next((k for k in range(2, 21) if tau_floor(k) < alpha), math.nan)
    for n in range(1, MAX_BLOCKS + 1):
        if reachable(TestDesign(design.test, n, design.n_items, design.n_comparisons), rope, alpha):
            return n
    return math.nan


def power_row(design: TestDesign, rope: float, alpha: float = ALPHA) -> dict:
    """One row of the design-power table, with a one-line message when the test cannot decide."""
    ok = reachable(design, rope, alpha)
    need = blocks_needed(design, rope, alpha)
    row = {"test": design.test, "n_blocks": design.n_blocks, "n_items": design.n_items,
           "n_comparisons": design.n_comparisons, "min_p": floor(design),
           "max_prob": max_probability(design, rope), "alpha": alpha,
           "threshold": bayes.CREDIBLE if design.test == StatTest.BAYES_SIGNED_RANK else math.nan,
           "reachable": ok, "blocks_needed": need, "message": ""}
    if not ok:
        row["message"] = _message(design, row, alpha)
    return row


def _message(design: TestDesign, row: dict, alpha: float) -> str:
    unit = BLOCKS.get(design.test, "task orders")
    if design.test == StatTest.BAYES_SIGNED_RANK:
        got = f"P <= {row['max_prob']:.3f} < {bayes.CREDIBLE}"
    elif design.n_comparisons > 1 and design.test == StatTest.WILCOXON_HOLM:
        got = (f"a smallest Holm-adjusted p of {row['min_p']:.3g} over {design.n_comparisons} pairs, "
               f"never below alpha = {alpha:g}")
    else:
        got = f"p >= {row['min_p']:.3g}, never below alpha = {alpha:g}"
    need = ("cannot decide at any size" if math.isnan(row["blocks_needed"])
            else f"needs >= {int(row['blocks_needed'])} {unit}")
    return f"{WHAT[design.test]}: {design.n_blocks} {unit} give {got}; {need}"


def wilcoxon_decides(power: pd.DataFrame) -> bool:
    """Whether the Holm-corrected Wilcoxon can call a pair significant in every cell of a power table
    (a count of its significant pairs is a statement only then)."""
    return bool(power[power["test"] == StatTest.WILCOXON_HOLM]["reachable"].all())


def design_tests(n_orders: int, n_methods: int, n_regimes: int) -> list[TestDesign]:
    """The tests the leaderboard shows for one dataset of a design (seeds averaged per order)."""
    pairs = n_methods * (n_methods - 1) // 2
    return [TestDesign(StatTest.BAYES_SIGNED_RANK, n_orders, 2),
            TestDesign(StatTest.WILCOXON_HOLM, n_orders, 2, pairs),
            TestDesign(StatTest.FRIEDMAN, n_orders, n_methods),
            TestDesign(StatTest.NEMENYI, n_orders, n_methods, pairs),
            TestDesign(StatTest.KENDALL_TAU, n_methods, n_methods),
            TestDesign(StatTest.KENDALL_W, n_regimes, n_methods)]


def design_power(n_orders: int, n_methods: int, n_regimes: int, rope: float,
                 alpha: float = ALPHA) -> list[dict]:
    """Power rows for a planned design (what `cl-bench run --dry-run` prints before any run)."""
    return [power_row(d, rope, alpha) for d in design_tests(n_orders, n_methods, n_regimes)]


def observed_power(cells, skip: dict, rope: float, alpha: float = ALPHA) -> pd.DataFrame:
    """The design-power table of the data at hand: the blocks each shown test really has.

    Per (dataset, regime): the pairwise and Friedman-family tests over the complete methods'
    task orders; per dataset (regime `(all)`): tau and W across its non-degenerate regimes;
    per regime pooled over datasets (dataset `(all)`): the pooled Bayesian test.
    """
    from harness.analysis.coverage import complete
    from harness.analysis.decisions import ALL, pooled_blocks

    rows = []
    for ds in cells.datasets:
        regs = [r for r in cells.regimes(ds) if r not in skip.get(ds, {})]
        for rg in cells.regimes(ds):
            keep, _ = complete(cells.mat(ds, rg))
            if len(keep) < 2:  # nothing is compared there: no test, no power to state
                continue
            n = len(cells.orders(ds, rg, keep))
            for d in design_tests(n, len(keep), len(regs))[:4]:
                rows.append({"dataset": ds, "regime": rg, **power_row(d, rope, alpha)})
        keep, _ = cells.complete_across(ds, regs) if regs else ([], [])
        if len(regs) >= 2 and len(keep) >= 2:
            for d in design_tests(0, len(keep), len(regs))[4:]:
                rows.append({"dataset": ds, "regime": ALL, **power_row(d, rope, alpha)})
    for rg in cells.regime_order:
        n = len(pooled_blocks(cells, rg))
        if n:
            design = TestDesign(StatTest.BAYES_SIGNED_RANK, n, 2)
            rows.append({"dataset": ALL, "regime": rg, **power_row(design, rope, alpha)})
    cols = ["dataset", "regime", "test", "n_blocks", "n_items", "n_comparisons", "min_p", "max_prob",
            "alpha", "threshold", "reachable", "blocks_needed", "message"]
    return pd.DataFrame(rows, columns=cols)


def power_lines(rows) -> list[str]:
    """Terminal lines: one warning per test that cannot decide, naming the cells it holds for, or an all-clear."""
    where: dict[str, list[str]] = {}
    for r in rows:
        if not r["reachable"]:
            cell = "/".join(str(r[k]) for k in ("dataset", "regime") if r.get(k))
            where.setdefault(r["message"], []).append(cell)
    if not where:
        return ["power: every test shown can reach its decision level with these blocks"]
    return [f"power warning{' (' + ', '.join(c for c in cells if c) + ')' if any(cells) else ''}: {m}"
            for m, cells in where.items()]


def plan_power_lines(n_orders: int, n_methods: int, n_regimes: int, rope: float) -> list[str]:
    """power_lines for a planned design (seeds are averaged within an order: blocks = orders)."""
    return power_lines(design_power(n_orders, n_methods, n_regimes, rope))
