"""Rank statistics: per-order ranks, mean ranks, agreement across regimes and orders,
rank reversals, Friedman + Nemenyi. Only methods with full coverage enter a comparison;
a method absent by design from some regimes (coverage.py) enters those it is planned in.

Every function takes the tidy frame and optionally a precomputed `Cells` (to share work).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from harness.analysis import stats
from harness.analysis.coverage import Cells, complete


def _cells(frame, cells):
    return cells if cells is not None else Cells(frame)


def _joined(names) -> str:
    return ", ".join(names)


def _in(methods, allowed) -> list[str]:
    """methods (in their order) that are in allowed."""
    allowed = set(allowed)
    return [m for m in methods if m in allowed]


def _ranks(om: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(stats.rank_rows(om.to_numpy()), index=om.index, columns=om.columns)


def order_ranks(frame: pd.DataFrame, cells: Cells | None = None) -> pd.DataFrame:
    """Rank of every complete method within each (dataset, regime, task order) by ACC."""
    c = _cells(frame, cells)
    parts = []
    for ds in c.datasets:
        for rg in c.regimes(ds):
            keep, _ = complete(c.mat(ds, rg))
            if not keep:
                continue
            om = c.orders(ds, rg, keep)
            long = om.stack().rename("acc").reset_index()
            long.columns = ["order", "method", "acc"]
            long["rank"] = _ranks(om).stack().to_numpy()
            parts.append(long.assign(dataset=ds, regime=rg))
    cols = ["dataset", "regime", "order", "method", "acc", "rank"]
    return pd.concat(parts)[cols].reset_index(drop=True) if parts else pd.DataFrame(columns=cols)


def _mean_rank_ci(ranks: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Mean rank per column with a bootstrap CI over rows (blocks resampled jointly)."""
    mean, lo, hi = stats.bootstrap_means(ranks.to_numpy(), seed=seed)
    return pd.DataFrame({"method": list(ranks.columns), "mean_rank": mean, "rank_lo": lo,
                         "rank_hi": hi, "n_blocks": len(ranks)})


def mean_ranks(frame: pd.DataFrame, cells: Cells | None = None, seed: int = stats.SEED) -> pd.DataFrame:
    """Mean rank over task orders per (dataset, regime, method) with bootstrap CI."""
    c = _cells(frame, cells)
    parts = []
    for ds in c.datasets:
        for rg in c.regimes(ds):
            keep, _ = complete(c.mat(ds, rg))
            if keep:
                ranks = _ranks(c.orders(ds, rg, keep))
                parts.append(_mean_rank_ci(ranks, seed).assign(dataset=ds, regime=rg))
    cols = ["dataset", "regime", "method", "mean_rank", "rank_lo", "rank_hi", "n_blocks"]
    return pd.concat(parts)[cols].reset_index(drop=True) if parts else pd.DataFrame(columns=cols)


def global_ranks(frame: pd.DataFrame, cells: Cells | None = None, seed: int = stats.SEED) -> pd.DataFrame:
    """Per regime: mean rank over all (dataset, order) blocks, for methods complete on every dataset."""
    c = _cells(frame, cells)
    parts = []
    for rg in c.regime_order:
        dss = [ds for ds in c.datasets if rg in c.regimes(ds)]
        everyone = sorted({m for ds in dss for m in c.planned(ds, rg)})  # absent by design: not "excluded"
        keep = set(everyone)
        for ds in dss:
            keep &= set(complete(c.mat(ds, rg))[0])
        keep = sorted(keep)
        if not keep:
            continue
        ranks = pd.concat([_ranks(c.orders(ds, rg, keep)) for ds in dss], ignore_index=True)
        res = _mean_rank_ci(ranks, seed).sort_values("mean_rank", kind="stable")
        parts.append(res.assign(regime=rg, n_datasets=len(dss),
                                excluded=_joined(m for m in everyone if m not in keep)))
    cols = ["regime", "method", "mean_rank", "rank_lo", "rank_hi", "n_blocks", "n_datasets", "excluded"]
    return pd.concat(parts)[cols].reset_index(drop=True) if parts else pd.DataFrame(columns=cols)


def mean_acc(cells: Cells, dataset: str, regime: str, methods: list[str]) -> pd.Series:
    """Mean ACC over task orders (seeds averaged first) for complete methods."""
    return cells.orders(dataset, regime, methods).mean()


def _skipped(skip: dict | None, dataset: str) -> dict[str, str]:
    """{regime: reason} of a dataset's regimes left out of agreement statistics (degenerate ones)."""
    return (skip or {}).get(dataset, {})


def regime_agreement(frame: pd.DataFrame, cells: Cells | None = None, seed: int = stats.SEED,
                     skip: dict | None = None) -> pd.DataFrame:
    """Kendall tau_b between the mean-ACC rankings of every pair of regimes, per dataset (both orders listed).

    skip: {dataset: {regime: reason}}; pairs with such a regime get no tau and say why in `note`.
    """
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        regs, left_out = c.regimes(ds), _skipped(skip, ds)
        for i, a in enumerate(regs):
            for b in regs[i:]:
                keep, out = c.complete_across(ds, [a, b])
                absent = c.absent(ds, [a, b])
                tau, p = math.nan, math.nan
                note = "; ".join(f"{r} left out: {left_out[r]}" for r in dict.fromkeys((a, b)) if r in left_out)
                if note or len(keep) < 2:
                    pass  # no ranking to compare: tau stays NaN, the note says why
                elif a == b:
                    tau = 1.0  # a ranking agrees with itself; no test to run
                else:
                    tau, p = stats.tau_permutation_test(mean_acc(c, ds, a, keep).to_numpy(),
                                                        mean_acc(c, ds, b, keep).to_numpy(), seed=seed)
                row = {"dataset": ds, "tau": tau, "p": p, "n_methods": len(keep), "excluded": _joined(out),
                       "absent": _joined(absent), "note": note}
                rows.append({**row, "regime_a": a, "regime_b": b})
                if a != b:
                    rows.append({**row, "regime_a": b, "regime_b": a})
    cols = ["dataset", "regime_a", "regime_b", "tau", "p", "n_methods", "excluded", "absent", "note"]
    return pd.DataFrame(rows, columns=cols)


def w_of_regimes(cells: Cells, dataset: str, regs: list[str]) -> dict:
    """Kendall's W of the mean-ACC rankings of the listed regimes, over the methods complete in all of them."""
    keep, out = cells.complete_across(dataset, regs)
    ranks = np.array([stats.rank_rows(mean_acc(cells, dataset, r, keep).to_numpy()) for r in regs]) \
        if keep and regs else np.empty((len(regs), 0))
    w = stats.kendall_w(ranks)
    return {"w": w["w"], "chi2": w["chi2"], "p": w["p"], "n_regimes": len(regs), "n_methods": len(keep),
            "excluded": _joined(out), "absent": _joined(cells.absent(dataset, regs))}


def w_across_regimes(frame: pd.DataFrame, cells: Cells | None = None, skip: dict | None = None) -> pd.DataFrame:
    """Kendall's W of the method rankings (mean ACC) across the regimes of a dataset (skipped ones left out)."""
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        left_out = _skipped(skip, ds)
        regs = [r for r in c.regimes(ds) if r not in left_out]
        rows.append({"dataset": ds, **w_of_regimes(c, ds, regs), "regimes_left_out": _joined(left_out)})
    return pd.DataFrame(rows, columns=["dataset", "w", "chi2", "p", "n_regimes", "n_methods", "excluded",
                                       "absent", "regimes_left_out"])


def w_across_orders(frame: pd.DataFrame, cells: Cells | None = None) -> pd.DataFrame:
    """Kendall's W of the per-order rankings within each (dataset, regime): order sensitivity."""
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        for rg in c.regimes(ds):
            keep, out = complete(c.mat(ds, rg))
            om = c.orders(ds, rg, keep)
            w = stats.kendall_w(stats.rank_rows(om.to_numpy()) if keep else np.empty((0, 0)))
            rows.append({"dataset": ds, "regime": rg, "w": w["w"], "chi2": w["chi2"], "p": w["p"],
                         "n_orders": len(om) if keep else 0, "n_methods": len(keep),
                         "excluded": _joined(out)})
    return pd.DataFrame(rows, columns=["dataset", "regime", "w", "chi2", "p", "n_orders",
                                       "n_methods", "excluded"])


def pairwise_wilcoxon(cells: Cells, dataset: str, regime: str, methods: list[str]) -> pd.DataFrame:
    """Paired Wilcoxon over task orders for every method pair, Holm-corrected within the regime."""
    om = cells.orders(dataset, regime, methods)
    pairs = list(itertools.combinations(methods, 2))
    p = [stats.wilcoxon_p(om[a], om[b]) for a, b in pairs]
    return pd.DataFrame({"method_1": [a for a, _ in pairs], "method_2": [b for _, b in pairs],
                         "diff": [float((om[a] - om[b]).mean()) for a, b in pairs],
                         "p": p, "p_holm": stats.holm(p)})


def rank_reversals(frame: pd.DataFrame, cells: Cells | None = None, alpha: float = 0.05,
                   skip: dict | None = None) -> pd.DataFrame:
    """Method pairs whose mean-ACC order flips between two regimes; significant = Holm p < alpha in both.

    The methods compared are those complete wherever they are planned; a pair is compared between
    two regimes that both run it. skip: {dataset: {regime: reason}} regimes left out (degenerate
    ones: their flips are noise).
    """
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        regs = [r for r in c.regimes(ds) if r not in _skipped(skip, ds)]
        keep, _ = c.complete_where_planned(ds, regs)
        tests = {r: pairwise_wilcoxon(c, ds, r, _in(keep, c.planned(ds, r))).set_index(["method_1", "method_2"])
                 for r in regs}
        for a, b in itertools.combinations(regs, 2):
            ta, tb = tests[a], tests[b]
            for pair in ta.index.intersection(tb.index, sort=False):
                da, db = ta.at[pair, "diff"], tb.at[pair, "diff"]
                if da * db < 0:
                    pa, pb = ta.at[pair, "p_holm"], tb.at[pair, "p_holm"]
                    rows.append({"dataset": ds, "regime_a": a, "regime_b": b, "method_1": pair[0],
                                 "method_2": pair[1], "diff_a": da, "diff_b": db, "p_holm_a": pa,
                                 "p_holm_b": pb, "significant_both": bool(pa < alpha and pb < alpha)})
    return pd.DataFrame(rows, columns=["dataset", "regime_a", "regime_b", "method_1", "method_2",
                                       "diff_a", "diff_b", "p_holm_a", "p_holm_b", "significant_both"])


def reversal_summary(frame: pd.DataFrame, reversals: pd.DataFrame, cells: Cells | None = None,
                     skip: dict | None = None) -> pd.DataFrame:
    """Per (dataset, regime pair): method pairs compared, order flips, flips significant in both
    (skipped regimes, as in rank_reversals, are left out)."""
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        regs = [r for r in c.regimes(ds) if r not in _skipped(skip, ds)]
        keep, out = c.complete_where_planned(ds, regs)
        for a, b in itertools.combinations(regs, 2):
            sel = reversals[(reversals["dataset"] == ds) & (reversals["regime_a"] == a)
                            & (reversals["regime_b"] == b)]
            k = len(_in(_in(keep, c.planned(ds, a)), c.planned(ds, b)))
            rows.append({"dataset": ds, "regime_a": a, "regime_b": b,
                         "n_pairs": k * (k - 1) // 2, "reversals": len(sel),
                         "significant": int(sel["significant_both"].sum()), "excluded": _joined(out)})
    return pd.DataFrame(rows, columns=["dataset", "regime_a", "regime_b", "n_pairs", "reversals",
                                       "significant", "excluded"])


def friedman_table(frame: pd.DataFrame, cells: Cells | None = None, alpha: float = 0.05) -> pd.DataFrame:
    """Friedman test over task orders per (dataset, regime) and the Nemenyi critical difference."""
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        for rg in c.regimes(ds):
            keep, out = complete(c.mat(ds, rg))
            om = c.orders(ds, rg, keep)
            n = len(om) if keep else 0
            f = stats.friedman(stats.rank_rows(om.to_numpy())) if keep and n >= 2 else \
                {"chi2": math.nan, "p": math.nan, "ff": math.nan, "ff_p": math.nan}
            rows.append({"dataset": ds, "regime": rg, "k": len(keep), "N": n, "chi2": f["chi2"],
                         "p": f["p"], "ff": f["ff"], "ff_p": f["ff_p"],
                         "cd": stats.nemenyi_cd(len(keep), n, alpha), "excluded": _joined(out)})
    return pd.DataFrame(rows, columns=["dataset", "regime", "k", "N", "chi2", "p", "ff", "ff_p",
                                       "cd", "excluded"])


def nemenyi_table(frame: pd.DataFrame, cells: Cells | None = None) -> pd.DataFrame:
    """Pairwise Nemenyi p-values (scikit-posthocs) over task orders per (dataset, regime)."""
    c = _cells(frame, cells)
    rows = []
    for ds in c.datasets:
        for rg in c.regimes(ds):
            keep, _ = complete(c.mat(ds, rg))
            om = c.orders(ds, rg, keep)
            if len(keep) < 2 or len(om) < 2:
                continue
            p = stats.nemenyi_pvalues(om.to_numpy())
            mr = _ranks(om).mean()
            rows += [{"dataset": ds, "regime": rg, "method_1": a, "method_2": b, "n_blocks": len(om),
                      "rank_diff": float(mr[a] - mr[b]), "p": float(p[i, j])}
                     for (i, a), (j, b) in itertools.combinations(enumerate(keep), 2)]
    return pd.DataFrame(rows, columns=["dataset", "regime", "method_1", "method_2", "n_blocks",
                                       "rank_diff", "p"])
