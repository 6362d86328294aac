"""View-model of the overview page (index.html): the headline, setup, global ranking, power, coverage."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ...analysis.families import families_in
from ...analysis.power import StatTest
from ...analysis.result import AnalysisResult
from ...analysis.scenarios import ALL
from ...analysis.tables import REFERENCE_METHOD, headline
from ...config.vocabulary import FAMILY_DESCRIPTIONS, Status
from ...execution.reproduce import sweep_commands
from .. import charts
from ..charts import records_of
from . import contributors, sections
from .writer import SiteWriter

# (link text, table): the overview's downloads after the runs, rankings and budget
DOWNLOADS = (("design power", "power"), ("credible reversals", "credible_reversals"),
             ("degenerate regimes", "degenerate"), ("regimes (family, trainable fraction)", "regimes"),
             ("within vs across families", "families"), ("τ by family pair", "family_tau"),
             ("W per family", "family_w"), ("methods absent by design", "absent"),
             ("scenario vs regime τ", "scenario_tau"))


def page(w: SiteWriter, t: AnalysisResult, records) -> Path:
    """Render index.html; returns its path."""
    frame = t.runs
    status = frame.groupby(["dataset", "status"]).size().unstack(fill_value=0)
    flagged_per = frame.groupby("dataset")["flagged"].sum()
    gr = t.global_ranks
    tables = t.tables()
    downloads = {"global ranking": w.table(gr, "global_ranks"), "coverage": w.table(t.coverage, "coverage"),
                 "all runs": w.table(frame, "runs"), "agreement (W across regimes)": w.table(t.w_regimes, "w_regimes"),
                 "flagged runs": w.table(t.flagged, "flagged"), "training budget": w.table(t.budget, "budget")}
    downloads.update({name: w.table(tables[key], key) for name, key in DOWNLOADS})
    ctx = {
        "title": "Overview", "n_runs": len(frame),
        "status_counts": frame["status"].value_counts().to_dict(),
        "status_table": [{"dataset": ds, **{k: int(v) for k, v in row.items()}, "_flagged": int(flagged_per[ds])}
                         for ds, row in status.iterrows()],
        "statuses": list(status.columns),
        "headline": headline(t), "setup": _setup(records, frame),
        # the sweeps of the local records only: a bundle's protocol copy is not in this results folder
        "sweep_commands": sweep_commands([r for r in records if not getattr(w.base["sources"].get(r.run_id),
                                                                            "bundle", "")],
                                         w.base["results_dir"]) if w.base["results_dir"] else [],
        "families": sections.families(t, None, w.base["regimes"]),
        "family_descriptions": {f: FAMILY_DESCRIPTIONS.get(f, "") for f in families_in(w.base["regimes"])},
        "power": sections.power(t.power), "bayes_blind": _bayes_blind(t.power),
        "flagged": records_of(t.flagged), "budget": _budget_summary(t.budget),
        "compute": compute_summary(t.methods),
        "unranked": [r for r in w.base["regimes"] if r not in set(gr["regime"])],
        # rankings are per scenario: one card per (scenario, regime), one chart per scenario
        "global": [{"scenario": sc, "regime": rg, "rows": records_of(sub)}
                   for (sc, rg), sub in gr.groupby(["scenario", "regime"], sort=False, dropna=False)],
        "global_charts": [{"scenario": sc, "chart": charts.rank_whiskers(sub, w.base["regimes"])}
                          for sc, sub in gr.groupby("scenario", sort=True, dropna=False)],
        "scenario_tau": _scenario_tau(t.scenario_tau),
        "failed": records_of(frame[frame["status"] != Status.OK][["run_id", "dataset", "regime", "method", "order",
                                                                  "seed", "status", "error"]]),
        "w_regimes": records_of(t.w_regimes),
        "downloads": downloads,
        "contributors": contributors.rows(records, w.base["sources"]),
    }
    return w.page("index.html", "index.html", **ctx)


def _setup(records, frame: pd.DataFrame) -> dict:
    """Scenario, pre-training and training budget of the records' specs (every distinct value)."""
    specs = [r.spec for r in records]

    def values(get) -> list:
        return sorted({_text(get(s)) for s in specs}, key=str)

    ok_steps = frame.loc[frame["status"] == Status.OK, "optimizer_steps"].dropna()
    # The pre-training is a `Pretrain` value (its kind and that kind's fields): shown by its label.
    return {"scenario": values(lambda s: s.scenario), "pretrain": values(lambda s: s.pretrain.label),
            "epochs": values(lambda s: s.training.epochs), "batch_size": values(lambda s: s.training.batch_size),
            "optimizer": values(lambda s: s.training.optimizer), "lr": values(lambda s: s.training.lr),
            "momentum": values(lambda s: s.training.momentum),
            "weight_decay": values(lambda s: s.training.weight_decay),
            "precision": values(lambda s: s.training.precision),
            "steps": float(ok_steps.mean()) if len(ok_steps) else None}


def _text(v) -> str:
    """A spec value as one line (mappings as compact JSON: `{checkpoint: PATH}` pre-training)."""
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list)) else str(v)


def _bayes_blind(pw: pd.DataFrame) -> dict:
    """How many (dataset, regime) Bayesian comparisons cannot reach the credible level at all:
    there, "no credible reversal" says nothing about agreement."""
    b = pw[pw["test"] == StatTest.BAYES_SIGNED_RANK]
    return {"n": int((~b["reachable"].astype(bool)).sum()), "of": len(b)}


def _budget_summary(budget: pd.DataFrame) -> dict:
    """Per-method budget rows, whether methods differ in steps and whether any declares its memory
    (the overview shows the table only then)."""
    rows = records_of(budget)
    rel = [r["relative_steps"] for r in rows if r["relative_steps"] is not None]
    memory = any(r.get("memory_samples") is not None or r.get("memory_bytes") is not None for r in rows)
    # 1% slack: steps follow the sample counts, which differ a little between task orders.
    return {"rows": rows, "differs": bool(rel) and max(rel) - min(rel) > 0.01, "memory": memory}


# Relative compute within 1% of the reference counts as equal (sample counts differ a little between orders)
EQUAL_COMPUTE = 0.01


def compute_summary(methods: pd.DataFrame) -> dict:
    """What the budget line may say about compute, per (scenario, dataset, regime) cell: the methods whose
    training FLOPs differ from the reference's (analysis.tables.REFERENCE_METHOD) in that cell, the methods
    with a cell not measured, and the cells without a measured reference; never averaged across cells."""
    rows = records_of(methods) if len(methods) else []
    cells, unmeasured, no_reference = [], set(), []
    for r in rows:
        if r.get("flops") is None:
            unmeasured.add(r["method"])
    keys = dict.fromkeys((r.get("scenario"), r["dataset"], r["regime"]) for r in rows)
    for sc, ds, rg in keys:
        mine = [r for r in rows if (r.get("scenario"), r["dataset"], r["regime"]) == (sc, ds, rg)]
        if not any(r["method"] == REFERENCE_METHOD and r.get("flops") for r in mine):
            no_reference.append({"scenario": sc, "dataset": ds, "regime": rg})
            continue
        differs = [{"method": r["method"], "ratio": r["relative_flops"]} for r in mine
                   if r.get("relative_flops") is not None and abs(r["relative_flops"] - 1.0) > EQUAL_COMPUTE]
        cells.append({"scenario": sc, "dataset": ds, "regime": rg,
                      "differs": sorted(differs, key=lambda d: (-d["ratio"], d["method"]))})
    return {"reference": REFERENCE_METHOD, "measured": any(r.get("flops") is not None for r in rows),
            "cells": cells, "differ": [c for c in cells if c["differs"]], "unmeasured": sorted(unmeasured),
            "no_reference": no_reference}


def _scenario_tau(st: pd.DataFrame) -> list[dict]:
    """Per dataset (class-IL records): its pooled scenario-vs-regime row, with its per-regime rows."""
    rows = records_of(st)
    pooled = [r for r in rows if r["regime"] == ALL]
    return [{**p, "per_regime": [r for r in rows if r["dataset"] == p["dataset"] and r["regime"] != ALL]}
            for p in pooled]
