"""Rank agreement within and across subspace families: do rankings survive a change of family?

A regime is a trainable subspace of one family (vocabulary.Family; `head`, `last-k` and
`full` are depth). A pair of regimes of one family is `within`, a pair of two families `across`.
The τ and reversal tables come from ranks.py and decisions.py (degenerate regimes are already out
of them); only Kendall's W per family ranks a family's regimes afresh. Methods absent by design
from a family (coverage.py) enter every comparison of the regimes that run them.
"""
from __future__ import annotations

import math

import pandas as pd

from harness.analysis import stats
from harness.analysis.coverage import Cells
from harness.analysis.frame import family_of, regime_order
from harness.analysis.ranks import w_of_regimes

ALL = "(all)"  # pooled over data sets (summary) or over every regime of a data set (W)
KINDS = ("within", "across")
SUMMARY_COLUMNS = ["dataset", "kind", "n_pairs", "mean_tau", "tau_lo", "tau_hi", "min_tau", "reversals",
                   "significant", "credible"]


def pair_kind(a: str, b: str) -> str:
    """`within` when two regimes share a family, else `across`."""
    return "within" if family_of(a) == family_of(b) else "across"


def label_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """A table with regime_a / regime_b columns, plus family_a, family_b and kind."""
    return df.assign(family_a=df["regime_a"].map(family_of).astype(object),
                     family_b=df["regime_b"].map(family_of).astype(object),
                     kind=[pair_kind(a, b) for a, b in zip(df["regime_a"], df["regime_b"])])


def families_in(regimes) -> list[str]:
    """The distinct families of regimes, in the order their first regime comes."""
    return list(dict.fromkeys(family_of(r) for r in regimes))


def family_tau(tau: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Each pair of distinct regimes once (the smaller one as regime_a), labelled within/across."""
    pos = {r: i for i, r in enumerate(order)}
    one_way = tau[tau["regime_a"].map(pos) < tau["regime_b"].map(pos)]
    cols = ["dataset", "regime_a", "regime_b", "family_a", "family_b", "kind", "tau", "p", "n_methods",
            "excluded", "absent", "note"]
    return label_pairs(one_way).reindex(columns=cols).reset_index(drop=True)


def _tau_stats(values, seed: int) -> dict:
    """Mean τ with a percentile bootstrap CI over the regime pairs, and the lowest τ."""
    v = [float(x) for x in values if isinstance(x, float) and not math.isnan(x)]
    if not v:
        return {"n_pairs": 0, "mean_tau": math.nan, "tau_lo": math.nan, "tau_hi": math.nan, "min_tau": math.nan}
    mean, lo, hi = stats.bootstrap_mean(v, seed=seed)
    return {"n_pairs": len(v), "mean_tau": mean, "tau_lo": lo, "tau_hi": hi, "min_tau": min(v)}


def family_summary(ftau: pd.DataFrame, reversals: pd.DataFrame, credible: pd.DataFrame,
                   seed: int = stats.SEED) -> pd.DataFrame:
    """Per dataset and pooled (`(all)`), within and across families: mean τ (bootstrap CI over
    regime pairs), order flips in mean ACC, those significant in both regimes, credible reversals.

    The pooled row counts each data set's reversals (not the Bayesian test pooled over data sets).
    The CI treats regime pairs as exchangeable; they share regimes, so read it as descriptive.
    """
    rev = label_pairs(reversals) if len(reversals) else reversals.assign(kind=pd.Series(dtype=object))
    cred = credible[credible["dataset"] != ALL] if len(credible) else credible
    cred = label_pairs(cred) if len(cred) else cred.assign(kind=pd.Series(dtype=object))
    rows = []
    for ds in [*sorted(ftau["dataset"].unique()), ALL]:
        t = _of(ftau, ds)
        for kind in KINDS:
            if not (t["kind"] == kind).any():
                continue  # a data set with one family has no across pairs
            r, c = _of(rev, ds), _of(cred, ds)
            r, c = r[r["kind"] == kind], c[c["kind"] == kind]
            sig = int(r["significant_both"].sum()) if "significant_both" in r else 0
            rows.append({"dataset": ds, "kind": kind, **_tau_stats(t.loc[t["kind"] == kind, "tau"], seed),
                         "reversals": len(r), "significant": sig, "credible": len(c)})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _of(df: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The rows of one dataset; all rows for `(all)`."""
    return df if dataset == ALL else df[df["dataset"] == dataset]


def w_by_family(cells: Cells, skip: dict | None = None) -> pd.DataFrame:
    """Kendall's W per dataset within each family with >= 2 regimes, and across all its regimes
    (family `(all)`); each over the methods complete in all the regimes it ranks."""
    rows = []
    for ds in cells.datasets:
        regs = [r for r in cells.regimes(ds) if r not in (skip or {}).get(ds, {})]
        groups = [(f, [r for r in regs if family_of(r) == f]) for f in families_in(regs)]
        for fam, members in [g for g in groups if len(g[1]) >= 2] + [(ALL, regs)]:
            rows.append({"dataset": ds, "family": fam, "regimes": ", ".join(members),
                         **w_of_regimes(cells, ds, members)})
    return pd.DataFrame(rows, columns=["dataset", "family", "regimes", "w", "chi2", "p", "n_regimes",
                                       "n_methods", "excluded", "absent"])


def absent_table(cells: Cells) -> pd.DataFrame:
    """Per dataset and method: the regimes it is not planned in (a method restricted to some families)."""
    rows = []
    for ds in cells.datasets:
        for m in cells.methods(ds):
            regs = [r for r in cells.regimes(ds) if m not in cells.planned(ds, r)]
            if regs:
                rows.append({"dataset": ds, "method": m, "families": ", ".join(families_in(regs)),
                             "regimes": ", ".join(regs)})
    return pd.DataFrame(rows, columns=["dataset", "method", "families", "regimes"])


def regime_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, regime) in regime order: family, median trainable fraction, trainable and total
    parameter counts (over every run with counts), and runs."""
    cols = ["dataset", "regime", "family", "fraction", "trainable", "total", "n_runs"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    pos = {r: i for i, r in enumerate(regime_order(frame))}
    out = frame.groupby(["dataset", "regime"], sort=False).agg(
        family=("family", "first"), fraction=("trainable_fraction", "median"),
        trainable=("trainable_params", "median"), total=("total_params", "median"),
        n_runs=("run_id", "size")).reset_index()
    out = out.assign(_r=out["regime"].map(pos)).sort_values(["dataset", "_r"], kind="stable")
    return out[cols].reset_index(drop=True)


def headline(summary: pd.DataFrame, regimes) -> dict | None:
    """Within vs across families in a few numbers and one sentence; None with fewer than two families."""
    fams = families_in(regimes)
    if len(fams) < 2:
        return None
    pooled = summary[summary["dataset"] == ALL].set_index("kind")
    part = {k: pooled.loc[k].to_dict() if k in pooled.index else None for k in KINDS}
    return {"families": fams, **part, "sentence": family_sentence(part["within"], part["across"])}


def family_sentence(within: dict | None, across: dict | None) -> str:
    """E.g. "Across families mean τ 0.21 [0.05, 0.40] over 6 regime pairs (within families 0.55, 3 pairs);
    2 credible reversals across families, 0 within."."""
    def tau(row):
        return "no τ" if not row or not row["n_pairs"] else f"{row['mean_tau']:.2f}"

    def ci(row):
        return "" if not row or not row["n_pairs"] or math.isnan(row["tau_lo"]) else \
            f" [{row['tau_lo']:.2f}, {row['tau_hi']:.2f}]"

    def pairs(row):
        n = int(row["n_pairs"]) if row else 0
        return f"{n} regime pair{'' if n == 1 else 's'}"

    n_across = int(across["credible"]) if across else 0
    n_within = int(within["credible"]) if within else 0
    return (f"Across families mean τ {tau(across)}{ci(across)} over {pairs(across)} "
            f"(within families {tau(within)}, {pairs(within)}); {n_across} credible reversal"
            f"{'' if n_across == 1 else 's'} across families, {n_within} within.")
