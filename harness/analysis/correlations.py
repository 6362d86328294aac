"""Update norm vs forgetting: per (dataset, regime), per family, pooled, against the size of the
trainable subspace (regime order: by trainable fraction), and step level."""
from __future__ import annotations

import pandas as pd

from harness.analysis import stats
from harness.analysis.frame import ok_runs, regime_order

ALL = "(all)"  # label of a pooled row
CORR_COLS = ["n", "rho", "rho_lo", "rho_hi", "rho_p", "r", "r_lo", "r_hi", "r_p"]


N_BOOT = 1000  # correlations re-rank inside every resample, the costliest bootstrap here


def _corr_rows(groups, x: str, y: str, cluster: str | None, seed: int) -> pd.DataFrame:
    rows = []
    for (ds, rg), sub in groups:
        cl = sub[cluster].to_numpy() if cluster else None
        # pooled rows resample within each regime: the protocol fixes how many runs each has
        strata = sub["regime"].to_numpy() if rg == ALL else None
        res = stats.corr_with_ci(sub[x].to_numpy(), sub[y].to_numpy(), cl, strata, N_BOOT, seed)
        rows.append({"dataset": ds, "regime": rg, **res})
    return pd.DataFrame(rows, columns=["dataset", "regime", *CORR_COLS])


def _scopes(df: pd.DataFrame, order: list[str]):
    """(dataset, regime) groups by depth, then each dataset pooled over its regimes.

    No pool across datasets: norms and forgetting live on different scales per dataset.
    """
    for ds in sorted(df["dataset"].unique()):
        d = df[df["dataset"] == ds]
        for rg in order:
            if rg in set(d["regime"]):
                yield (ds, rg), d[d["regime"] == rg]
        yield (ds, ALL), d


def norm_vs_forgetting(frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Spearman/Pearson of per-run mean update norm vs forgetting, with bootstrap CIs (ok runs)."""
    ok = ok_runs(frame)
    return _corr_rows(_scopes(ok, regime_order(frame)), "mean_update_norm", "forgetting", None, seed)


def norm_vs_forgetting_by_family(frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Spearman/Pearson of mean update norm vs forgetting pooled within each family of a dataset
    (bootstrap within regimes), for datasets with at least two families (else it is the pooled row)."""
    ok = ok_runs(frame)
    order = regime_order(frame)
    rows = []
    for ds in sorted(ok["dataset"].unique()):
        d = ok[ok["dataset"] == ds]
        if d["family"].nunique() < 2:
            continue
        for fam in sorted(d["family"].unique(), key=lambda f: _family_pos(f, d, order)):
            sub = d[d["family"] == fam]
            res = stats.corr_with_ci(sub["mean_update_norm"].to_numpy(), sub["forgetting"].to_numpy(), None,
                                     sub["regime"].to_numpy(), N_BOOT, seed)
            regs = [r for r in order if r in set(sub["regime"])]
            rows.append({"dataset": ds, "family": fam, "regimes": ", ".join(regs), "n_regimes": len(regs), **res})
    return pd.DataFrame(rows, columns=["dataset", "family", "regimes", "n_regimes", *CORR_COLS])


def _family_pos(family: str, sub: pd.DataFrame, order: list[str]) -> int:
    """Position of a family's first regime in the regime order (families listed smallest first)."""
    return min(order.index(r) for r in set(sub.loc[sub["family"] == family, "regime"]))


def depth_index(frame: pd.DataFrame) -> pd.Series:
    """Position of each run's regime in the regime order (0 = smallest trainable fraction)."""
    pos = {r: i for i, r in enumerate(regime_order(frame))}
    return frame["regime"].map(pos)


def depth_trend(frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Per dataset: Spearman of mean update norm / forgetting with the regime's position in the
    regime order (rank-equivalent to its trainable fraction).

    rho_means: over the regime means (one point per regime); rho (with CI): over ok runs.
    """
    ok = ok_runs(frame).assign(depth_index=depth_index(frame))
    rows = []
    for ds in sorted(ok["dataset"].unique()):
        sub = ok[ok["dataset"] == ds]
        means = sub.groupby("depth_index")[["mean_update_norm", "forgetting"]].mean()
        for q in ("mean_update_norm", "forgetting"):
            m = means[q].dropna()
            rho_means = stats.corr_with_ci(m.index.to_numpy(), m.to_numpy(), n_boot=0)["rho"]
            res = stats.corr_with_ci(sub["depth_index"].to_numpy(), sub[q].to_numpy(),
                                     strata=sub["regime"].to_numpy(), n_boot=N_BOOT, seed=seed)
            rows.append({"dataset": ds, "quantity": q, "n_regimes": len(m), "rho_means": rho_means,
                         **{k: res[k] for k in ("n", "rho", "rho_lo", "rho_hi", "rho_p")}})
    return pd.DataFrame(rows, columns=["dataset", "quantity", "n_regimes", "rho_means", "n",
                                       "rho", "rho_lo", "rho_hi", "rho_p"])


def depth_profile(frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, regime): family, median trainable fraction and count, and mean update norm and
    mean forgetting over ok runs, with CIs."""
    ok = ok_runs(frame)
    rows = []
    for ds in sorted(ok["dataset"].unique()):
        for i, rg in enumerate(regime_order(frame)):
            sub = ok[(ok["dataset"] == ds) & (ok["regime"] == rg)]
            if sub.empty:
                continue
            mean, lo, hi = stats.bootstrap_means(sub[["mean_update_norm", "forgetting"]].to_numpy(), seed=seed)
            rows.append({"dataset": ds, "regime": rg, "family": sub["family"].iloc[0], "depth_index": i,
                         "fraction": float(sub["trainable_fraction"].median()),
                         "trainable": float(sub["trainable_params"].median()), "n": len(sub),
                         "norm": mean[0], "norm_lo": lo[0], "norm_hi": hi[0],
                         "forgetting": mean[1], "forgetting_lo": lo[1], "forgetting_hi": hi[1]})
    return pd.DataFrame(rows, columns=["dataset", "regime", "family", "depth_index", "fraction", "trainable", "n",
                                       "norm", "norm_lo", "norm_hi", "forgetting", "forgetting_lo", "forgetting_hi"])


def step_frame(records) -> pd.DataFrame:
    """Long frame of (u_t, f_t) pairs, t >= 2, from ok runs: one row per run and step."""
    rows = []
    for rec in records:
        if not rec.ok:
            continue
        norms = rec.update_norms or {}
        u, f = norms.get("shared") or [], norms.get("step_forgetting") or []
        base = {"run_id": rec.run_id, "dataset": rec.dataset, "regime": rec.spec.regime, "method": rec.method}
        for t, (ut, ft) in enumerate(zip(u, f), start=1):
            if ut is not None and ft is not None:
                rows.append({**base, "t": t, "u": float(ut), "f": float(ft)})
    return pd.DataFrame(rows, columns=["run_id", "dataset", "regime", "method", "t", "u", "f"])


def step_level(records, frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Spearman/Pearson of u_t vs f_t; CIs resample whole runs (steps of a run are not independent)."""
    steps = step_frame(records)
    return _corr_rows(_scopes(steps, regime_order(frame)), "u", "f", "run_id", seed)
