"""View-models of the any-time evaluation (issue 29): the dataset page's section (curves of the old tasks'
accuracy during training, stability-gap depth per method and regime, rankings by ACC, min-ACC and WC-ACC
side by side, tau between them, the gap's trend with the trainable fraction) and the method page's
columns. Every function returns None / [] / False where no run has a continual-evaluation curve, and the
pages then render as they did before continual evaluation existed.

Definitions and sources of the metrics: docs/metrics-anytime.md (config/metrics.py ANYTIME labels them).
"""
from __future__ import annotations

import pandas as pd

from ...analysis.result import AnalysisResult
from ...config.metrics import ANYTIME
from ...config.numbers import is_number
from .. import charts
from ..charts import records_of
from ..formatting import best_as_printed

# (link text, table) of the section's downloads, cut to the page's data set; written only with a section
DOWNLOADS = (("any-time curves", "anytime_curves"), ("any-time rankings", "anytime_ranks"),
             ("any-time τ", "anytime_tau"), ("gap trend", "gap_trend"))
RANKED = ("acc", "min_acc", "wc_acc", "a_auc")  # the columns of a regime's ranking, ACC first
METHOD_COLUMNS = ("gap_depth", "min_acc", "wc_acc", "a_auc")  # next to ACC on a method page (all in %)


def has_curves(t: AnalysisResult) -> bool:
    """Whether any run of these tables has a continual-evaluation curve."""
    return len(t.anytime_curves) > 0


def section(t: AnalysisResult, regs, colours: dict, scale: float) -> dict | None:
    """The dataset page's "Any-time evaluation" section of one data set's tables; None without curves."""
    if not has_curves(t):
        return None
    regs = [r for r in regs if r in set(t.anytime_curves["regime"])]
    return {"panels": charts.anytime_panels(t.anytime_curves, regs, colours, scale),
            "gap": gap_grid(t.methods, regs, scale), "ranks": rank_tables(t.anytime_ranks, regs),
            "tau": _in_order(t.anytime_tau, regs), "trend": records_of(t.gap_trend.sort_values("method")),
            "regs": regs}


def gap_grid(mt: pd.DataFrame, regs, scale: float = 100.0) -> dict:
    """Method x regime cells of the mean stability-gap depth with its CI (and, for the hover text, the
    recovery, unrecovered gaps, min-ACC, WC-ACC); the shallowest gap of each regime as printed marked."""
    mt = mt[mt["gap_depth"].notna()] if "gap_depth" in mt else mt.iloc[:0]
    cells: dict[str, dict] = {m: {} for m in sorted(mt["method"].unique())}
    for r in records_of(mt):
        cells[r["method"]][r["regime"]] = r
    regs = [rg for rg in regs if any(rg in c for c in cells.values())]
    best = {rg: best_as_printed({m: c[rg]["gap_depth"] * scale for m, c in cells.items() if rg in c},
                                ANYTIME["gap_depth"].higher_is_better) for rg in regs}
    rows = [{"method": m, "cells": [{**c[rg], "best": m in best[rg]} if rg in c else None for rg in regs]}
            for m, c in cells.items()]
    return {"regs": regs, "rows": rows}


def rank_tables(ranks: pd.DataFrame, regs) -> list[dict]:
    """Per regime: its methods by ACC rank, each with ACC, min-ACC, WC-ACC and A_AUC and their mean
    ranks, and how many places each any-time ranking moves the method against ACC (+: up)."""
    out = []
    for rg in regs:
        rows = sorted(records_of(ranks[ranks["regime"] == rg]), key=lambda r: (_key(r["acc_rank"]), r["method"]))
        if not rows:
            continue
        for r in rows:
            r["shift"] = {m: (r["acc_rank"] - r[f"{m}_rank"]) if is_number(r[f"{m}_rank"]) and
                          is_number(r["acc_rank"]) else None for m in RANKED[1:]}
        out.append({"regime": rg, "rows": rows, "n": rows[0]["n"]})
    return out


def _key(v) -> float:
    return v if is_number(v) else float("inf")


def _in_order(df: pd.DataFrame, regs) -> list[dict]:
    """Rows of a (dataset, regime) table in the page's regime order."""
    rows = {r["regime"]: r for r in records_of(df)}
    return [rows[rg] for rg in regs if rg in rows]


def method_columns(mt: pd.DataFrame) -> tuple[str, ...]:
    """The any-time columns a method page shows next to ACC: () when none of its rows has a curve."""
    present = [k for k in METHOD_COLUMNS if k in mt and mt[k].notna().any()]
    return tuple(present) if present else ()
