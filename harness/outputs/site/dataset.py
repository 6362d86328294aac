"""View-model of a dataset page: the method x regime grid, rank agreement and reversals, Bayesian
comparisons, design power, update norm vs forgetting, Friedman + Nemenyi."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...analysis.families import families_in
from ...analysis.power import wilcoxon_decides
from ...analysis.result import AnalysisResult
from ...analysis.tables import REFERENCE_METHOD
from ...config.metrics import METRICS
from ...config.numbers import is_number
from ...config.vocabulary import FAMILY_DESCRIPTIONS, Scenario
from .. import charts
from ..charts import records_of
from ..formatting import best_as_printed, half_width, slug
from . import anytime, contributors, sections
from .writer import SiteWriter

# (link text, table): every per-dataset download, cut to the page's data set
DOWNLOADS = (("method x regime", "methods"), ("Kendall tau", "tau"), ("rank reversals", "reversals"),
             ("credible reversals", "credible_reversals"), ("Bayesian comparisons", "bayes"),
             ("design power", "power"), ("degenerate regimes", "degenerate"), ("accuracy curves", "curves"),
             ("Friedman + CD", "friedman"), ("Nemenyi pairwise p", "nemenyi"), ("W across orders", "w_orders"),
             ("norm vs forgetting", "norm_forgetting"), ("norm vs forgetting per family", "norm_forgetting_family"),
             ("regimes (family, trainable fraction)", "regimes"), ("within vs across families", "family_tau"),
             ("W per family", "family_w"), ("depth profile", "depth_profile"),
             ("depth trend", "depth_trend"), ("step level", "step_level"),
             ("scenario vs regime τ", "scenario_tau"), ("runs", "runs"))


def page(w: SiteWriter, t: AnalysisResult, ds: str, records=()) -> Path:
    """Render dataset-<slug>.html for data set ds; returns its path."""
    sel = t.of_dataset(ds)
    regs = [r for r in w.base["regimes"] if r in set(sel.methods["regime"])]
    tables = sel.tables()
    section = anytime.section(sel, regs, w.base["method_colour"], w.base["scale"])
    # the any-time tables are downloads only where the page has the section: a page without curves is unchanged
    links = DOWNLOADS + (anytime.DOWNLOADS if section else ())
    ctx = {"title": ds, "dataset": ds, "regs": regs, "anytime": section,
           **_results(w, sel, regs), **_agreement(w, t, sel, ds, regs), **_correlations(w, sel, regs),
           "downloads": {name: w.table(tables[key], f"{slug(ds)}-{key}") for name, key in links},
           "contributors": (rows := contributors.rows(records, w.base["sources"], set(sel.runs["run_id"]))),
           "by_cell": contributors.by_cell(rows)}
    return w.page("dataset.html", f"dataset-{slug(ds)}.html", **ctx)


def _results(w: SiteWriter, sel: AnalysisResult, regs) -> dict:
    """The method x regime grid, the metric rows, the regimes' table and the accuracy curves."""
    deg = _degenerate(sel.degenerate)
    mt = sel.methods
    return {"degenerate": deg, "grid": _grid(mt, regs, deg, _regime_cells(sel.regimes), w.base["scale"]),
            "rows": records_of(mt), "regime_rows": records_of(sel.regimes),
            "page_scenarios": sorted(set(sel.runs["scenario"])) if len(w.base["scenarios"]) > 1
            or Scenario.CLASS_IL in w.base["scenarios"] else [],
            "task_aware": bool(mt["acc_task_aware"].notna().any()),
            "memory": bool(mt[["memory_samples", "memory_bytes"]].notna().any().any()),
            "compute": bool(mt["flops"].notna().any()), "reference": REFERENCE_METHOD,
            "scenario_rows": records_of(sel.scenario_tau),
            "family_descriptions": {f: FAMILY_DESCRIPTIONS.get(f, "") for f in families_in(regs)},
            "curves": charts.curve_panels(sel.curves, regs, w.base["method_colour"], w.base["scale"])}


def _agreement(w: SiteWriter, t: AnalysisResult, sel: AnalysisResult, ds: str, regs) -> dict:
    """Do rankings agree across regimes: tau, rank shift, W, families, reversals, Bayes, power, CD."""
    fractions = {r["regime"]: r["fraction"] for r in records_of(sel.regimes)}
    return {"tau": charts.heatmap(sel.tau, regs, _degenerate(sel.degenerate)),
            "rank_shift": charts.rank_shift(sel.methods, regs, w.base["method_colour"], fractions),
            "families": sections.families(t, ds, regs), "w_regimes": records_of(sel.w_regimes),
            "credible": records_of(sel.credible_reversals), "bayes": _bayes_matrices(sel.bayes, regs),
            "reversals": records_of(sel.reversals), "reversal_summary": records_of(sel.reversal_summary),
            "power": sections.power(sel.power, with_dataset=False),
            "wilcoxon_decides": wilcoxon_decides(sel.power),
            "cd": charts.cd_diagrams(sel.methods, sel.friedman, regs),
            "friedman": records_of(sel.friedman), "w_orders": records_of(sel.w_orders)}


def _correlations(w: SiteWriter, sel: AnalysisResult, regs) -> dict:
    """Update norm vs forgetting: scatter panels, correlations, the profile against the trainable fraction."""
    scale, colours = w.base["scale"], w.base["regime_colour"]
    forgetting = "forgetting" + (" %" if scale == 100 else "")
    return {"scatter": charts.scatter(sel.runs, sel.norm_forgetting, regs),
            "profile": {k: charts.fraction_profile(records_of(sel.depth_profile), k, f, colours, label)
                        for k, f, label in (("norm", 1.0, "mean update norm"), ("forgetting", scale, forgetting))},
            "trend": records_of(sel.depth_trend), "norm_forgetting": records_of(sel.norm_forgetting),
            "nf_family": records_of(sel.norm_forgetting_family), "step_level": records_of(sel.step_level)}


def _degenerate(deg: pd.DataFrame) -> dict[str, str]:
    """{regime: reason} of the degenerate regimes of one data set's degenerate table."""
    sub = deg[deg["degenerate"].astype(bool)]
    return {r: str(why or "all methods tie") for r, why in zip(sub["regime"], sub["reason"])}


def _regime_cells(rt: pd.DataFrame) -> dict:
    """{regime: {family, fraction}} of one data set's regime table."""
    return {r["regime"]: {"family": r["family"], "fraction": r["fraction"]} for r in records_of(rt)}


def _grid(mt: pd.DataFrame, regs, degenerate: dict, info: dict, scale: float = 100.0) -> dict:
    """Method x regime cells (ACC, CI, forgetting, flags); the best mean ACC of each regime marked;
    per regime its family and trainable fraction (info: _regime_cells).

    A degenerate regime marks no best: every method ties there.
    """
    rows = {m: {} for m in sorted(mt["method"].unique())}
    for r in records_of(mt):
        rows[r["method"]][r["regime"]] = r
    best = {rg: frozenset() if rg in degenerate else best_as_printed(
        {m: c[rg]["acc"] * scale for m, c in rows.items() if rg in c and c[rg]["acc"] is not None},
        METRICS["acc"].higher_is_better) for rg in regs}
    out = [{"method": m, "cells": [_grid_cell(cells.get(rg), m in best[rg]) for rg in regs]}
           for m, cells in rows.items()]
    return {"rows": out, "regs": [{"name": rg, "degenerate": degenerate.get(rg, ""),
                                   "family": info.get(rg, {}).get("family", ""),
                                   "fraction": info.get(rg, {}).get("fraction")} for rg in regs]}


def _grid_cell(r: dict | None, best: bool) -> dict | None:
    """One grid cell: the metric row plus whether it holds the column's best mean ACC (as printed)."""
    if r is None:
        return None
    return {**r, "half": half_width(r["acc_lo"], r["acc_hi"]), "best": best}


def _bayes_matrices(bayes: pd.DataFrame, regs) -> list[dict]:
    """Per regime: the pairwise P(row better) / P(equal) / P(column better) matrix and the decided pairs."""
    out = []
    for rg in regs:
        sub = records_of(bayes[bayes["regime"] == rg])
        if not sub:
            continue
        methods = sorted({r["method_1"] for r in sub} | {r["method_2"] for r in sub})
        cell = {}
        for r in sub:  # both orientations: row i vs column j reads P(i better), P(equal), P(j better)
            win = {"method_1": "row", "method_2": "col"}.get(r["decision"], r["decision"])
            cell[(r["method_1"], r["method_2"])] = {"better": r["p_1"], "equal": r["p_rope"], "worse": r["p_2"],
                                                    "decision": win, "diff": r["diff"], "n": r["n_blocks"]}
            flip = {"row": "col", "col": "row"}.get(win, win)
            cell[(r["method_2"], r["method_1"])] = {"better": r["p_2"], "equal": r["p_rope"], "worse": r["p_1"],
                                                    "decision": flip, "n": r["n_blocks"],
                                                    "diff": -r["diff"] if is_number(r["diff"]) else None}
        decided = [r for r in sub if r["decision"] in ("method_1", "method_2", "equal")]
        out.append({"regime": rg, "methods": methods, "cell": {f"{a}\x00{b}": v for (a, b), v in cell.items()},
                    "decided": decided, "n_pairs": len(sub), "rope": sub[0]["rope"]})
    return out
