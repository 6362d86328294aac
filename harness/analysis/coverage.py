"""Coverage rules: which methods have every cell of a comparison (nothing is imputed).

A cell counts when its run is `ranked` (frame column): ok, and not flagged by a learning check
unless flagged runs are included. Flagged runs are left out so that comparisons stay paired:
a method flagged in more than half of a (dataset, regime)'s task orders is left out of it;
otherwise each task order holding a flagged run is left out for every method (e.g. an order
whose third task no method could learn under `head`), and the rest is compared.

What is expected: a method is planned in a (dataset, regime) when it has a record in some regime
of that regime's family on the data set. Methods restricted to some families (gpm, became: depth
regimes only) are never planned in the others; there they are absent, not missing.
"""
from __future__ import annotations

import pandas as pd

from harness.analysis.frame import family_of, regime_order
from harness.config.vocabulary import Status

UNIT = ["order", "seed"]  # one replicate; seeds are averaged within an order afterwards


def unit_matrix(sub: pd.DataFrame, metric: str = "acc") -> pd.DataFrame:
    """(order, seed) x method values of `metric` over ranked runs; NaN marks a failed/flagged/missing cell.

    Rows are every (order, seed) seen in `sub` for any method, failed runs included,
    so a method that failed, was flagged or never ran there shows a hole.
    """
    units = pd.MultiIndex.from_frame(sub[UNIT].drop_duplicates().sort_values(UNIT))
    ok = sub[(sub["status"] == Status.OK) & sub[metric].notna()]
    methods = sorted(sub["method"].unique())
    wide = ok.pivot_table(index=UNIT, columns="method", values=metric, aggfunc="mean")
    wide = wide.reindex(index=units, columns=methods)
    left_out = ok[~ok["ranked"].astype(bool)] if "ranked" in ok else ok.iloc[:0]
    if left_out.empty:
        return wide
    flagged = left_out.assign(f=True).pivot_table(index=UNIT, columns="method", values="f", aggfunc="any")
    return without_flagged(wide, flagged.reindex(index=units, columns=methods).eq(True))


def without_flagged(wide: pd.DataFrame, flagged: pd.DataFrame) -> pd.DataFrame:
    """The unit matrix with flagged runs left out as the module docstring says (paired comparisons)."""
    wide = wide.copy()
    mostly = flagged.sum(axis=0) > len(wide) / 2
    wide.loc[:, mostly[mostly].index] = float("nan")
    rows = flagged.loc[:, ~mostly].any(axis=1)
    return wide[~rows]


def complete(mat: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(methods with every cell, methods missing at least one) of a unit matrix (none without rows)."""
    if len(mat.index) == 0:
        return [], sorted(mat.columns)
    full = mat.notna().all(axis=0)
    return sorted(full.index[full]), sorted(full.index[~full])


def order_matrix(mat: pd.DataFrame, methods: list[str]) -> pd.DataFrame:
    """Average seeds within each task order: order x method."""
    return mat[methods].groupby(level="order").mean()


def planned_methods(frame: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """{(dataset, regime): methods planned there}: those with a record in some regime of its family."""
    families = frame["family"] if "family" in frame else frame["regime"].map(family_of)
    by_family = frame.assign(_f=families).groupby(["dataset", "_f"])["method"].unique()
    cells = frame.assign(_f=families)[["dataset", "regime", "_f"]].drop_duplicates()
    return {(ds, rg): sorted(by_family[(ds, f)]) for ds, rg, f in cells.itertuples(index=False)}


def coverage_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per planned (dataset, regime, method): expected replicates, ok, failed by status, missing, flagged.

    A method never planned in a regime's family (see the module docstring) has no row there.
    """
    rows = []
    order = {r: i for i, r in enumerate(regime_order(frame))}
    planned = planned_methods(frame)
    for (ds, rg), sub in frame.groupby(["dataset", "regime"], sort=False):
        n_units = len(sub[UNIT].drop_duplicates())
        full = set(complete(unit_matrix(sub))[0])
        for m in planned[(ds, rg)]:
            own = sub[sub["method"] == m]
            n_ok = int(((own["status"] == Status.OK) & own["acc"].notna()).sum())
            bad = own[own["status"] != Status.OK]["status"].value_counts().to_dict()
            rows.append({"dataset": ds, "regime": rg, "method": m, "expected": n_units,
                         "ok": n_ok, "not_ok": int(sum(bad.values())),
                         "statuses": ", ".join(f"{k}: {v}" for k, v in sorted(bad.items())),
                         "missing": max(n_units - len(own[UNIT].drop_duplicates()), 0),
                         "flagged": int(own["flagged"].sum()), "complete": m in full})
    out = pd.DataFrame(rows, columns=["dataset", "regime", "method", "expected", "ok",
                                      "not_ok", "statuses", "missing", "flagged", "complete"])
    out["_r"] = out["regime"].map(order)
    return out.sort_values(["dataset", "_r", "method"]).drop(columns="_r").reset_index(drop=True)


class Cells:
    """Unit matrices per (dataset, regime), computed once and shared by the rank statistics."""

    def __init__(self, frame: pd.DataFrame, metric: str = "acc"):
        self.frame = frame
        self.regime_order = regime_order(frame)
        self._mats = {key: unit_matrix(sub, metric)
                      for key, sub in frame.groupby(["dataset", "regime"], sort=False)}
        self._methods = {ds: sorted(sub["method"].unique()) for ds, sub in frame.groupby("dataset")}
        self._planned = planned_methods(frame) if len(frame) else {}
        self._full = {key: set(complete(mat)[0]) for key, mat in self._mats.items()}

    @property
    def datasets(self) -> list[str]:
        """Datasets, sorted by name."""
        return sorted(self._methods)

    def methods(self, dataset: str) -> list[str]:
        """Every method seen on a dataset (any status)."""
        return self._methods[dataset]

    def regimes(self, dataset: str) -> list[str]:
        """Regimes present for a dataset, in regime order (by trainable fraction)."""
        return [r for r in self.regime_order if (dataset, r) in self._mats]

    def mat(self, dataset: str, regime: str) -> pd.DataFrame:
        """The unit matrix of one (dataset, regime); empty when that cell never ran."""
        return self._mats.get((dataset, regime), pd.DataFrame())

    def planned(self, dataset: str, regime: str) -> list[str]:
        """Methods the design runs in one (dataset, regime) (coverage rules above)."""
        return self._planned.get((dataset, regime), [])

    def complete_across(self, dataset: str, regimes) -> tuple[list[str], list[str]]:
        """Methods with every cell in all the listed regimes, and those planned in all of them
        but left out (missing, failed or flagged cells); absent ones are in `absent`."""
        keep = set(self.methods(dataset))
        for r in regimes:
            keep &= self._full.get((dataset, r), set())
        gone = set(self.absent(dataset, regimes))
        return sorted(keep), [m for m in self.methods(dataset) if m not in keep and m not in gone]

    def absent(self, dataset: str, regimes) -> list[str]:
        """Methods of the dataset not planned in at least one of the listed regimes (by design)."""
        regimes = list(regimes)
        return [m for m in self.methods(dataset) if any(m not in self.planned(dataset, r) for r in regimes)]

    def complete_where_planned(self, dataset: str, regimes) -> tuple[list[str], list[str]]:
        """Methods with every cell in each listed regime where they are planned, and the planned ones
        left out; with a single family this is complete_across."""
        regimes = list(regimes)
        keep, out = [], []
        for m in self.methods(dataset):
            where = [r for r in regimes if m in self.planned(dataset, r)]
            if where:
                ok = all(m in self._full.get((dataset, r), set()) for r in where)
                (keep if ok else out).append(m)
        return keep, out

    def orders(self, dataset: str, regime: str, methods: list[str]) -> pd.DataFrame:
        """order x method ACC (seeds averaged) for the given complete methods."""
        return order_matrix(self.mat(dataset, regime), methods)
