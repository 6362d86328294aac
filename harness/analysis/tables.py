"""The tables the leaderboard shows, computed once from records: `analyse(records)`."""
from __future__ import annotations

import math

import pandas as pd

from harness.analysis import correlations, curves, decisions, families, power, ranks, stats
from harness.analysis.coverage import Cells, coverage_table
from harness.analysis.degenerate import degenerate_regimes, degenerate_table
from harness.analysis.frame import percent_scale, records_to_frame, regime_order, warning_codes
from harness.analysis.result import AnalysisResult, AnalysisSettings
from harness.config.metrics import METRIC_NAMES
from harness.config.vocabulary import Status

# acc/forgetting_task_aware: class-IL runs' masked (task-id given) view; NaN for task-IL runs
VALUES = (*METRIC_NAMES, "mean_update_norm", "drift", "acc_task_aware", "forgetting_task_aware")
BUDGET = ("optimizer_steps", "samples_seen")  # mean only: a budget is set by the protocol, not sampled


def metric_table(frame: pd.DataFrame, seed: int = stats.SEED) -> pd.DataFrame:
    """Per (dataset, regime, method): run counts by status, flagged runs, mean budget and
    mean + bootstrap CI of every metric (ok runs, flagged ones included: they are marked, not hidden)."""
    pos = {r: i for i, r in enumerate(regime_order(frame))}
    rows = []
    for (ds, rg, m), sub in frame.groupby(["dataset", "regime", "method"], sort=False):
        ok = sub[sub["status"] == Status.OK]
        row = {"dataset": ds, "regime": rg, "method": m, "n_runs": len(sub), "n_ok": len(ok),
               "n_failed": len(sub) - len(ok),
               "statuses": ", ".join(f"{k}: {v}" for k, v in sorted(
                   sub.loc[sub["status"] != Status.OK, "status"].value_counts().items())),
               "n_flagged": int(sub["flagged"].sum()), "warning_codes": _codes(sub["warning_codes"]),
               **{b: float(ok[b].mean()) if ok[b].notna().any() else math.nan for b in BUDGET}}
        mean, lo, hi = stats.bootstrap_means(ok[list(VALUES)].to_numpy(), seed=seed)
        for i, v in enumerate(VALUES):
            row.update({v: mean[i], f"{v}_lo": lo[i], f"{v}_hi": hi[i]})
        rows.append(row)
    cols = ["dataset", "regime", "method", "n_runs", "n_ok", "n_failed", "statuses", "n_flagged",
            "warning_codes", *BUDGET, *[c for v in VALUES for c in (v, f"{v}_lo", f"{v}_hi")]]
    out = pd.DataFrame(rows, columns=cols)
    out["_r"] = out["regime"].map(pos)
    return out.sort_values(["dataset", "_r", "method"]).drop(columns="_r").reset_index(drop=True)


def _codes(column: pd.Series) -> str:
    """Comma-joined sorted unique codes of a column of comma-joined codes."""
    return ",".join(sorted({c for cs in column for c in cs.split(",") if c}))


def budget_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean optimizer steps and samples over ok runs, and steps relative to the median method.

    The ratio is taken per dataset (budgets differ between datasets), then averaged over them.
    """
    cols = ["method", "optimizer_steps", "samples_seen", "relative_steps", "n_datasets"]
    ok = frame[(frame["status"] == Status.OK) & frame["optimizer_steps"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    per = ok.groupby(["dataset", "method"])[list(BUDGET)].mean().reset_index()
    median = per.groupby("dataset")["optimizer_steps"].transform("median")
    per["relative_steps"] = per["optimizer_steps"] / median.where(median > 0)
    out = per.groupby("method").agg(optimizer_steps=("optimizer_steps", "mean"),
                                    samples_seen=("samples_seen", "mean"),
                                    relative_steps=("relative_steps", "mean"),
                                    n_datasets=("dataset", "nunique")).reset_index()
    return out[cols].sort_values("method").reset_index(drop=True)


def flagged_table(records, regimes=()) -> pd.DataFrame:
    """One row per flagged record: where it ran, its warning codes and its first warning's message."""
    cols = ["run_id", "dataset", "regime", "method", "order", "seed", "status", "n_warnings",
            "codes", "first_message"]
    rows = [{"run_id": r.run_id, "dataset": r.dataset, "regime": r.spec.regime, "method": r.method,
             "order": int(r.spec.order), "seed": int(r.spec.seed), "status": r.status,
             "n_warnings": len(r.warnings), "codes": ",".join(warning_codes(r.warnings)),
             "first_message": str(r.warnings[0].get("message", ""))}
            for r in records if r.flagged]
    pos = {r: i for i, r in enumerate(regimes)}
    out = pd.DataFrame(rows, columns=cols).assign(_r=lambda d: d["regime"].map(pos))
    out = out.sort_values(["dataset", "_r", "method", "order", "seed"], kind="stable")
    return out.drop(columns="_r").reset_index(drop=True)


def analyse(records, seed: int = stats.SEED, include_flagged: bool = False,
            rope: float = decisions.ROPE_POINTS) -> AnalysisResult:
    """Every leaderboard table (result.py); `runs` is the tidy per-run frame they come from.

    Flagged runs (learning-check warnings) are left out of every rank statistic, as missing
    cells, unless include_flagged; the metric tables always include and count them.
    Degenerate regimes (every method ties) are left out of tau, W and credible reversals.
    rope: region of practical equivalence of the Bayesian comparisons, in ACC points.
    """
    frame = records_to_frame(records, include_flagged)
    cells = Cells(frame)
    mt = metric_table(frame, seed)
    mr = ranks.mean_ranks(frame, cells, seed)
    rope_acc = decisions.rope_fraction(rope, percent_scale(frame))
    bayes = decisions.bayes_table(cells, rope_acc, seed)
    degenerate = degenerate_table(frame, cells, bayes=bayes, rope_points=rope)
    skip = degenerate_regimes(degenerate)
    order = regime_order(frame)
    credible = decisions.credible_reversals(bayes, order, {**skip, decisions.ALL: _everywhere(skip, cells)})
    reversals = _with_credible(ranks.rank_reversals(frame, cells, skip=skip), credible, bayes)
    tau = ranks.regime_agreement(frame, cells, seed, skip)
    family_tau = families.family_tau(tau, order)
    return AnalysisResult(
        runs=frame,
        coverage=coverage_table(frame),
        methods=mt.merge(mr, on=["dataset", "regime", "method"], how="left"),
        order_ranks=ranks.order_ranks(frame, cells),
        global_ranks=ranks.global_ranks(frame, cells, seed),
        tau=tau,
        w_regimes=ranks.w_across_regimes(frame, cells, skip),
        # within vs across subspace families (families.py); regimes: family and trainable size
        regimes=families.regime_table(frame),
        family_tau=family_tau,
        families=families.family_summary(family_tau, reversals, credible, seed),
        family_w=families.w_by_family(cells, skip),
        absent=families.absent_table(cells),
        w_orders=ranks.w_across_orders(frame, cells),
        reversals=families.label_pairs(reversals),
        reversal_summary=ranks.reversal_summary(frame, reversals, cells, skip),
        friedman=ranks.friedman_table(frame, cells),
        nemenyi=ranks.nemenyi_table(frame, cells),
        bayes=bayes,
        credible_reversals=families.label_pairs(credible),
        degenerate=degenerate,
        power=power.observed_power(cells, skip, rope_acc),
        curves=curves.task_curves(records, seed),
        norm_forgetting=correlations.norm_vs_forgetting(frame, seed),
        norm_forgetting_family=correlations.norm_vs_forgetting_by_family(frame, seed),
        depth_profile=correlations.depth_profile(frame, seed),
        depth_trend=correlations.depth_trend(frame, seed),
        step_level=correlations.step_level(records, frame, seed),
        budget=budget_table(frame),
        flagged=flagged_table(records, order),
        settings=AnalysisSettings(rope_points=float(rope), rope=rope_acc, credible=decisions.bayes.CREDIBLE,
                                  alpha=power.ALPHA, include_flagged=include_flagged),
    )


def _everywhere(skip: dict, cells: Cells) -> dict[str, str]:
    """Regimes degenerate in every dataset that has them: left out of the pooled comparisons too."""
    regs = {r for ds in cells.datasets for r in cells.regimes(ds)}
    return {r: "degenerate in every data set" for r in sorted(regs)
            if all(r in skip.get(ds, {}) for ds in cells.datasets if r in cells.regimes(ds))}


def _with_credible(reversals: pd.DataFrame, credible: pd.DataFrame, bayes: pd.DataFrame) -> pd.DataFrame:
    """The reversal list with, per regime, the posterior probability of the order seen there
    (p_a, p_b; `strength` = the smaller) and `credible`: both reach the credible level."""
    keys = ["dataset", "regime_a", "regime_b", "method_1", "method_2"]
    hits = set(map(tuple, credible[keys].to_numpy().tolist())) if len(credible) else set()
    probs = {(r.dataset, r.regime, r.method_1, r.method_2): (r.p_1, r.p_2) for r in bayes.itertuples()}

    def p_of(ds, rg, m1, m2, diff):
        pair = probs.get((ds, rg, m1, m2))
        return math.nan if pair is None else (pair[0] if diff > 0 else pair[1])

    out = reversals.assign(
        p_a=[p_of(r.dataset, r.regime_a, r.method_1, r.method_2, r.diff_a) for r in reversals.itertuples()],
        p_b=[p_of(r.dataset, r.regime_b, r.method_1, r.method_2, r.diff_b) for r in reversals.itertuples()])
    out["strength"] = out[["p_a", "p_b"]].min(axis=1)
    out["credible"] = [tuple(r) in hits for r in out[keys].to_numpy().tolist()]
    return out


def headline(t: AnalysisResult) -> dict:
    """How much rankings change across regimes, in a few numbers for the overview.

    Degenerate regimes are already out of tau and W; credible reversals lead.
    """
    tau = t.tau
    off = tau[(tau["regime_a"] < tau["regime_b"]) & tau["tau"].notna()]
    rs = t.reversal_summary
    w = t.w_regimes["w"].dropna()
    credible = t.credible_reversals
    per_dataset = credible[credible["dataset"] != decisions.ALL]
    deg, pw = t.degenerate, t.power
    return {"mean_tau": float(off["tau"].mean()) if len(off) else math.nan,
            "min_tau": float(off["tau"].min()) if len(off) else math.nan,
            "n_tau": len(off), "shallow_deep": _extreme_pair_tau(t),
            "reversals": int(rs["reversals"].sum()), "significant": int(rs["significant"].sum()),
            "pairs_compared": int(rs["n_pairs"].sum()),
            "mean_w": float(w.mean()) if len(w) else math.nan,
            "credible": len(per_dataset),
            "credible_pooled": len(credible) - len(per_dataset),
            "top_credible": per_dataset.head(3).to_dict("records"),
            "top_reversals": _strongest(t.reversals),
            # the Wilcoxon count is a statement only where the test could call anything significant
            "wilcoxon_decides": power.wilcoxon_decides(pw),
            "degenerate": deg[deg["degenerate"].astype(bool)][["dataset", "regime", "reason"]].to_dict("records"),
            "power_warnings": sorted(set(pw.loc[~pw["reachable"].astype(bool), "message"])),
            "rope": t.settings.rope_points,
            # within vs across subspace families; None with a single family
            "families": families.headline(t.families, regime_order(t.runs))}


def _strongest(reversals: pd.DataFrame, n: int = 3) -> list[dict]:
    """The n reversals whose two orders are most probable (credible or not), strongest first."""
    top = reversals.dropna(subset=["strength"]).sort_values("strength", ascending=False, kind="stable")
    return top.head(n).to_dict("records")


def _extreme_pair_tau(t: AnalysisResult) -> list[dict]:
    """tau between the shallowest and the deepest regime of each dataset with a tau (degenerate ones have none)."""
    order = regime_order(t.runs)
    tau = t.tau
    out = []
    for ds, sub in tau.groupby("dataset"):
        valid = sub[sub["tau"].notna() & (sub["regime_a"] != sub["regime_b"])]
        regs = [r for r in order if r in set(valid["regime_a"])]
        if len(regs) >= 2:
            row = sub[(sub["regime_a"] == regs[0]) & (sub["regime_b"] == regs[-1])].iloc[0]
            out.append({"dataset": ds, "a": regs[0], "b": regs[-1], "tau": row["tau"],
                        "p": row["p"], "n_methods": row["n_methods"]})
    return out


def power_summary(frame: pd.DataFrame, rope: float = decisions.ROPE_POINTS) -> list[str]:
    """The end-of-sweep power lines: tests that cannot decide with the blocks the records have."""
    if frame.empty:
        return []
    cells = Cells(frame)
    rope_acc = decisions.rope_fraction(rope, percent_scale(frame))
    bayes = decisions.bayes_table(cells, rope_acc)
    skip = degenerate_regimes(degenerate_table(frame, cells, bayes=bayes, rope_points=rope))
    rows = power.observed_power(cells, skip, rope_acc)
    return power.power_lines(rows.to_dict("records"))
