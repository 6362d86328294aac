"""The tables the leaderboard shows, computed once from records: `analyse(records)`."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.analysis import anytime, correlations, curves, decisions, families, power, ranks, scenarios, stats
from harness.analysis.coverage import Cells, coverage_table
from harness.analysis.degenerate import degenerate_regimes, degenerate_table
from harness.analysis.frame import percent_scale, records_to_frame, regime_order, warning_codes
from harness.analysis.result import AnalysisResult, AnalysisSettings
from harness.config.metrics import ANYTIME_NAMES, METRIC_NAMES
from harness.config.vocabulary import Scenario, Status

# acc/forgetting_task_aware: class-IL runs' masked (task-id given) view; NaN for task-IL runs
# ANYTIME_NAMES: the any-time metrics of runs with a continual-evaluation curve (NaN without one)
VALUES = (*METRIC_NAMES, "mean_update_norm", "drift", "acc_task_aware", "forgetting_task_aware", *ANYTIME_NAMES)
# mean only: a budget is set by the protocol, not sampled; memory: what the method keeps after the last task
BUDGET = ("optimizer_steps", "samples_seen", "memory_samples", "memory_bytes")
# compute (budget.compute): a cell's mean only when every ok run of it was measured ("not measured" is NaN)
COMPUTE = ("forward_samples", "backward_samples", "sample_passes", "flops", "peak_rss_bytes")
# The reference of relative compute: the method every other is compared with in its own cell
REFERENCE_METHOD = "naive"
RELATIVE = ("relative_passes", "relative_flops")


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
               **{b: float(ok[b].mean()) if ok[b].notna().any() else math.nan for b in BUDGET},
               **{c: float(ok[c].mean()) if len(ok) and ok[c].notna().all() else math.nan for c in COMPUTE}}
        mean, lo, hi = stats.bootstrap_means(ok[list(VALUES)].to_numpy(), seed=seed)
        for i, v in enumerate(VALUES):
            row.update({v: mean[i], f"{v}_lo": lo[i], f"{v}_hi": hi[i]})
        rows.append(row)
    cols = ["dataset", "regime", "method", "n_runs", "n_ok", "n_failed", "statuses", "n_flagged",
            "warning_codes", *BUDGET, *COMPUTE, *[c for v in VALUES for c in (v, f"{v}_lo", f"{v}_hi")]]
    out = relative_compute(pd.DataFrame(rows, columns=cols))
    out["_r"] = out["regime"].map(pos)
    return out.sort_values(["dataset", "_r", "method"]).drop(columns="_r").reset_index(drop=True)


def relative_compute(cells: pd.DataFrame) -> pd.DataFrame:
    """`cells` (one row per dataset, regime, method) with each cell's sample-passes and FLOPs relative to
    REFERENCE_METHOD's in the same dataset and regime (NaN: either not measured, or no reference there)."""
    ref = cells[cells["method"] == REFERENCE_METHOD].set_index(["dataset", "regime"])
    key = pd.MultiIndex.from_frame(cells[["dataset", "regime"]])
    out = cells.copy()
    for name, column in zip(RELATIVE, ("sample_passes", "flops")):
        base = ref[column].reindex(key).to_numpy(dtype=float) if len(ref) else math.nan
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 or NaN reference: NaN below
            values = cells[column].to_numpy(dtype=float) / base
        out[name] = [v if math.isfinite(v) else math.nan for v in values]
    return out


def _codes(column: pd.Series) -> str:
    """Comma-joined sorted unique codes of a column of comma-joined codes."""
    return ",".join(sorted({c for cs in column for c in cs.split(",") if c}))


def budget_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean optimizer steps and samples over ok runs, steps relative to the median method,
    and the memory it keeps after the last task (stored samples and bytes; NaN: declares none).

    The ratio is taken per dataset (budgets differ between datasets), then averaged over them.
    """
    cols = ["method", "optimizer_steps", "samples_seen", "relative_steps", "memory_samples", "memory_bytes",
            "n_datasets", "sample_passes", "flops", "peak_rss_bytes", "relative_flops_min", "relative_flops_max"]
    ok = frame[(frame["status"] == Status.OK) & frame["optimizer_steps"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    per = ok.groupby(["dataset", "method"])[list(BUDGET)].mean().reset_index()
    median = per.groupby("dataset")["optimizer_steps"].transform("median")
    per["relative_steps"] = per["optimizer_steps"] / median.where(median > 0)
    out = per.groupby("method").agg(optimizer_steps=("optimizer_steps", "mean"),
                                    samples_seen=("samples_seen", "mean"),
                                    relative_steps=("relative_steps", "mean"),
                                    memory_samples=("memory_samples", "mean"),
                                    memory_bytes=("memory_bytes", "mean"),
                                    n_datasets=("dataset", "nunique")).reset_index()
    return _compute_columns(out, ok)[cols].sort_values("method").reset_index(drop=True)


def _compute_columns(out: pd.DataFrame, ok: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean sample-passes, FLOPs and peak memory (NaN unless every ok run was measured), and the
    range over its (dataset, regime) cells of its FLOPs relative to REFERENCE_METHOD's in the same cell
    (never averaged over regimes or datasets)."""
    def measured_mean(column):
        return ok.groupby("method")[column].agg(lambda v: float(v.mean()) if v.notna().all() else math.nan)

    cells = ok.groupby(["dataset", "regime", "method"])[list(COMPUTE)].agg(
        lambda v: float(v.mean()) if v.notna().all() else math.nan).reset_index()
    rel = relative_compute(cells).groupby("method")["relative_flops"]
    out = out.copy()
    for column in ("sample_passes", "flops", "peak_rss_bytes"):
        out[column] = out["method"].map(measured_mean(column))
    out["relative_flops_min"] = out["method"].map(rel.min())
    out["relative_flops_max"] = out["method"].map(rel.max())
    return out


def flagged_table(records, regimes=()) -> pd.DataFrame:
    """One row per flagged record: where it ran, its warning codes and its first warning's message."""
    cols = ["run_id", "dataset", "scenario", "regime", "method", "order", "seed", "status", "n_warnings",
            "codes", "first_message"]
    rows = [{"run_id": r.run_id, "dataset": r.dataset, "scenario": str(r.spec.scenario), "regime": r.spec.regime,
             "method": r.method,
             "order": int(r.spec.order), "seed": int(r.spec.seed), "status": r.status,
             "n_warnings": len(r.warnings), "codes": ",".join(warning_codes(r.warnings)),
             "first_message": str(r.warnings[0].get("message", ""))}
            for r in records if r.flagged]
    pos = {r: i for i, r in enumerate(regimes)}
    out = pd.DataFrame(rows, columns=cols).assign(_r=lambda d: d["regime"].map(pos))
    out = out.sort_values(["dataset", "scenario", "_r", "method", "order", "seed"], kind="stable")
    return out.drop(columns="_r").reset_index(drop=True)


def analyse(records, seed: int = stats.SEED, include_flagged: bool = False,
            rope: float = decisions.ROPE_POINTS) -> AnalysisResult:
    """Every leaderboard table (result.py); `runs` is the tidy per-run frame they come from.

    The scenario is part of every key: the records of each scenario are analysed on their own (a
    board merging task-IL and class-IL results never ranks one against the other) and every table
    gets a `scenario` column. Flagged runs (learning-check warnings) are left out of every rank
    statistic, as missing cells, unless include_flagged; the metric tables always include and count
    them. Degenerate regimes (every method ties) are left out of tau, W and credible reversals.
    rope: region of practical equivalence of the Bayesian comparisons, in ACC points.
    """
    frame = records_to_frame(records, include_flagged)
    scenarios = sorted(frame["scenario"].unique()) or [None]
    parts = []
    for sc in scenarios:
        mine = records if sc is None else [r for r in records if str(r.spec.scenario) == sc]
        sub = frame if len(scenarios) == 1 else frame[frame["scenario"] == sc].reset_index(drop=True)
        parts.append((sc, _tables(mine, sub, seed, rope)))
    tables = {name: _with_scenario([(sc, t[name]) for sc, t in parts]) for name in parts[0][1]}
    rope_acc = decisions.rope_fraction(rope, percent_scale(frame))
    return AnalysisResult(runs=frame, **tables, flagged=flagged_table(records, regime_order(frame)),
                          settings=AnalysisSettings(rope_points=float(rope), rope=rope_acc,
                                                    credible=decisions.bayes.CREDIBLE, alpha=power.ALPHA,
                                                    include_flagged=include_flagged))


def _with_scenario(parts: list) -> pd.DataFrame:
    """The scenarios' tables of one name as one, with a `scenario` column after `dataset` (else first)."""
    out = []
    for sc, df in parts:
        pos = list(df.columns).index("dataset") + 1 if "dataset" in df.columns else 0
        df = df.copy()
        df.insert(pos, "scenario", pd.Series([sc] * len(df), index=df.index, dtype=object))
        out.append(df)
    return out[0] if len(out) == 1 else pd.concat(out, ignore_index=True)


def _tables(records, frame: pd.DataFrame, seed: int, rope: float) -> dict[str, pd.DataFrame]:
    """The tables of one scenario's records (`frame`: their rows of the tidy frame), by AnalysisResult field."""
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
    any_cells = anytime.metric_cells(frame)
    return dict(
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
        # class-IL only: does the scenario reorder methods as much as the regime does (scenarios.py)
        scenario_tau=scenarios.scenario_agreement(frame, tau, cells, seed, skip),
        # any-time evaluation (anytime.py): runs with a continual-evaluation curve only
        anytime_curves=anytime.curves(records, seed),
        anytime_ranks=anytime.ranks(frame, any_cells),
        anytime_tau=anytime.tau(frame, any_cells, seed),
        gap_trend=anytime.gap_trend(frame, power.ALPHA, seed),
        budget=budget_table(frame),
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
            "families": _families_headline(t),
            # class-IL records: does the scenario reorder methods as much as the regime does
            "scenario": t.scenario_tau[t.scenario_tau["regime"] == scenarios.ALL].to_dict("records")}


def _families_headline(t: AnalysisResult) -> dict | None:
    """families.headline of each scenario's rows; with several scenarios their sentences, each labelled."""
    order = regime_order(t.runs)
    per = {sc: families.headline(t.families[t.families["scenario"] == sc], order)
           for sc in dict.fromkeys(t.families["scenario"])}
    found = {sc: h for sc, h in per.items() if h}
    if len(found) <= 1:
        return next(iter(found.values()), None) if found else families.headline(t.families, order)
    first = next(iter(found.values()))
    return {**first, "sentence": " ".join(f"{sc}: {h['sentence']}" for sc, h in found.items())}


def _strongest(reversals: pd.DataFrame, n: int = 3) -> list[dict]:
    """The n reversals whose two orders are most probable (credible or not), strongest first."""
    top = reversals.dropna(subset=["strength"]).sort_values("strength", ascending=False, kind="stable")
    return top.head(n).to_dict("records")


def _extreme_pair_tau(t: AnalysisResult) -> list[dict]:
    """tau between the shallowest and the deepest regime of each dataset with a tau (degenerate ones have none)."""
    order = regime_order(t.runs)
    tau = t.tau
    out = []
    for (ds, sc), sub in tau.groupby(["dataset", "scenario"], dropna=False):
        valid = sub[sub["tau"].notna() & (sub["regime_a"] != sub["regime_b"])]
        regs = [r for r in order if r in set(valid["regime_a"])]
        if len(regs) >= 2:
            row = sub[(sub["regime_a"] == regs[0]) & (sub["regime_b"] == regs[-1])].iloc[0]
            out.append({"dataset": ds, "scenario": sc, "a": regs[0], "b": regs[-1], "tau": row["tau"],
                        "p": row["p"], "n_methods": row["n_methods"]})
    return out


def power_summary(frame: pd.DataFrame, rope: float = decisions.ROPE_POINTS) -> list[str]:
    """The end-of-sweep power lines: tests that cannot decide with the blocks the records have
    (each scenario's records on their own, as analyse compares them)."""
    if frame.empty:
        return []
    rope_acc = decisions.rope_fraction(rope, percent_scale(frame))
    rows = []
    for sub in _by_scenario(frame):
        cells = Cells(sub)
        bayes = decisions.bayes_table(cells, rope_acc)
        skip = degenerate_regimes(degenerate_table(sub, cells, bayes=bayes, rope_points=rope))
        rows += power.observed_power(cells, skip, rope_acc).to_dict("records")
    return power.power_lines(rows)


def scenario_summary(frame: pd.DataFrame, rope: float = decisions.ROPE_POINTS, seed: int = stats.SEED) -> list[str]:
    """The end-of-sweep lines of class-IL records: does the scenario reorder methods as much as the
    regime does (scenarios.py); none without class-IL records."""
    sub = frame[frame["scenario"] == Scenario.CLASS_IL].reset_index(drop=True) if len(frame) else frame
    if sub.empty:
        return []
    cells = Cells(sub)
    rope_acc = decisions.rope_fraction(rope, percent_scale(frame))
    skip = degenerate_regimes(degenerate_table(sub, cells, bayes=decisions.bayes_table(cells, rope_acc, seed),
                                               rope_points=rope))
    tau = ranks.regime_agreement(sub, cells, seed, skip)
    return scenarios.scenario_lines(scenarios.scenario_agreement(sub, tau, cells, seed, skip))


def _by_scenario(frame: pd.DataFrame) -> list[pd.DataFrame]:
    """The frame's rows of each scenario (the frame itself when it holds one)."""
    names = sorted(frame["scenario"].unique()) if "scenario" in frame else []
    if len(names) <= 1:
        return [frame]
    return [frame[frame["scenario"] == sc].reset_index(drop=True) for sc in names]
