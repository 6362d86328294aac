"""The tables the leaderboard shows, computed once from records: `analyse(records)`."""
from __future__ import annotations

import math

import pandas as pd

from harness.analysis import correlations, ranks, stats
from harness.analysis.coverage import Cells, coverage_table
from harness.analysis.frame import records_to_frame, regime_order
from harness.config.vocabulary import METRICS

VALUES = (*METRICS, "mean_update_norm", "drift")


def metric_table(frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, regime, method): run counts by status and mean + bootstrap CI of every metric (ok runs)."""
    pos = {r: i for i, r in enumerate(regime_order(frame))}
    rows = []
    for (ds, rg, m), sub in frame.groupby(["dataset", "regime", "method"], sort=False):
        ok = sub[sub["status"] == "ok"]
        row = {"dataset": ds, "regime": rg, "method": m, "n_runs": len(sub), "n_ok": len(ok),
               "n_failed": len(sub) - len(ok),
               "statuses": ", ".join(f"{k}: {v}" for k, v in sorted(
                   sub.loc[sub["status"] != "ok", "status"].value_counts().items()))}
        mean, lo, hi = stats.bootstrap_means(ok[list(VALUES)].to_numpy(), seed=seed)
        for i, v in enumerate(VALUES):
            row.update({v: mean[i], f"{v}_lo": lo[i], f"{v}_hi": hi[i]})
        rows.append(row)
    cols = ["dataset", "regime", "method", "n_runs", "n_ok", "n_failed", "statuses",
            *[c for v in VALUES for c in (v, f"{v}_lo", f"{v}_hi")]]
    out = pd.DataFrame(rows, columns=cols)
    out["_r"] = out["regime"].map(pos)
    return out.sort_values(["dataset", "_r", "method"]).drop(columns="_r").reset_index(drop=True)


def analyse(records, seed: int = stats.SEED) -> dict[str, pd.DataFrame]:
    """Every leaderboard table, by name; `frame` is the tidy per-run frame they come from."""
    frame = records_to_frame(records)
    cells = Cells(frame)
    mt = metric_table(frame, seed)
    mr = ranks.mean_ranks(frame, cells, seed)
    reversals = ranks.rank_reversals(frame, cells)
    return {
        "runs": frame,
        "coverage": coverage_table(frame),
        "methods": mt.merge(mr, on=["dataset", "regime", "method"], how="left"),
        "order_ranks": ranks.order_ranks(frame, cells),
        "global_ranks": ranks.global_ranks(frame, cells, seed),
        "tau": ranks.regime_agreement(frame, cells, seed),
        "w_regimes": ranks.w_across_regimes(frame, cells),
        "w_orders": ranks.w_across_orders(frame, cells),
        "reversals": reversals,
        "reversal_summary": ranks.reversal_summary(frame, reversals, cells),
        "friedman": ranks.friedman_table(frame, cells),
        "norm_forgetting": correlations.norm_vs_forgetting(frame, seed),
        "depth_profile": correlations.depth_profile(frame, seed),
        "depth_trend": correlations.depth_trend(frame, seed),
        "step_level": correlations.step_level(records, frame, seed),
    }


def headline(tables: dict[str, pd.DataFrame]) -> dict:
    """How much rankings change across regimes, in a few numbers for the overview."""
    tau = tables["tau"]
    off = tau[(tau["regime_a"] < tau["regime_b"]) & tau["tau"].notna()]
    rs = tables["reversal_summary"]
    w = tables["w_regimes"]["w"].dropna()
    shallow_deep = _extreme_pair_tau(tables)
    return {"mean_tau": float(off["tau"].mean()) if len(off) else math.nan,
            "min_tau": float(off["tau"].min()) if len(off) else math.nan,
            "n_tau": len(off), "shallow_deep": shallow_deep,
            "reversals": int(rs["reversals"].sum()), "significant": int(rs["significant"].sum()),
            "pairs_compared": int(rs["n_pairs"].sum()),
            "mean_w": float(w.mean()) if len(w) else math.nan}


def _extreme_pair_tau(tables) -> list[dict]:
    """tau between the shallowest and the deepest regime of each dataset."""
    order = regime_order(tables["runs"])
    tau = tables["tau"]
    out = []
    for ds, sub in tau.groupby("dataset"):
        regs = [r for r in order if r in set(sub["regime_a"])]
        if len(regs) >= 2:
            row = sub[(sub["regime_a"] == regs[0]) & (sub["regime_b"] == regs[-1])].iloc[0]
            out.append({"dataset": ds, "a": regs[0], "b": regs[-1], "tau": row["tau"],
                        "p": row["p"], "n_methods": row["n_methods"]})
    return out
