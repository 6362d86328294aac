"""Static HTML leaderboard: analysis tables -> page view-models -> jinja2 templates -> a folder of pages.

Self-contained: CSS, SVG and the one script are inlined (templates.py), links are relative, so
the site opens from file:// and can be copied anywhere. One module per job: `filters` (text the
templates print), `templates` (where templates and static files live), `writer` (owns and prunes
the output folder), and one view-model module per page type (`overview`, `dataset`, `method`,
`run`; `sections` for what the overview and dataset pages share). Chart geometry is computed in
outputs/charts.py, diagnostics are aggregated in analysis/diagnostics.py.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...analysis.frame import FLAG, percent_scale, regime_order
from ...analysis.result import AnalysisResult
from ...analysis.tables import analyse
from ...config.specs import RunRecord
from ...config.vocabulary import WARNINGS, Scenario
from .. import charts
from ..downloads import has_curves
from ..formatting import rope_text, slug
from . import dataset, method, overview, run
from .contributors import held
from .templates import assets, environment
from .writer import SiteWriter

__all__ = ["build_site", "panel_labels", "slug"]  # slug: how a page's file is named after its subject


def build_site(records: list[RunRecord], out_dir: Path, *, results_dir: str | None = None,
               include_flagged: bool = False, rope: float = 1.0, root: Path | None = None,
               force: bool = False, sources: dict | None = None) -> Path:
    """Render the whole leaderboard for a list of records; returns index.html's path.

    root: the folder the user named, out_dir inside it (default out_dir): no part of out_dir
    below it may be a symbolic link. force: write into a non-empty folder holding no site.
    Flagged runs (learning-check warnings) are shown and marked everywhere, and left out of
    the rankings unless include_flagged; held ones (contributors.held: a bundle whose rerun differs) are
    left out of every table and ranking whatever include_flagged says. rope: region of practical
    equivalence of the Bayesian comparisons, in ACC points. sources: {run_id: where the record came from}
    on a board merging bundles (anything with contributor, status, reason, hardware, bundle;
    service/bundles.py Source), shown per cell and per run.
    """
    # the folder is checked (links, someone else's files) before any work; on leaving the block the
    # staged files are renamed into place and files of the previous build this one did not write are pruned
    with SiteWriter(Path(out_dir), environment(), {}, root=root, force=force) as w:
        # a record whose bundle's rerun differs enters no table or ranking, --include-flagged or not (the service
        # marks it only unless --include-unverified); its run page and contributors row still show it
        analysed = analyse([r for r in records if not held(r)], include_flagged=include_flagged, rope=rope)
        labels = panel_labels(analysed)
        tables = relabelled(analysed, labels)
        w.curves = has_curves(tables.runs)  # without curves the downloads are what they were before issue 29
        w.base = base = _base(tables, records, results_dir=results_dir, include_flagged=include_flagged,
                              sources=sources or {})
        infos = method.method_infos()
        index = overview.page(w, tables, records)
        for ds in base["datasets"]:
            dataset.page(w, tables, ds, records)
        for m in base["methods"]:
            method.page(w, tables, records, m, infos)
        for rec in records:
            run.page(w, rec, labels.get((rec.dataset, str(rec.spec.scenario)), rec.dataset))
    return index


def panel_labels(t: AnalysisResult) -> dict[tuple[str, str], str]:
    """{(dataset, scenario): the name its page and rows go by}: the dataset's name, and for a dataset
    recorded in more than one scenario (a board merging results folders) "name · scenario" for each
    scenario but its first (task-IL when it has one): the scenarios' cells never share a page."""
    pairs = t.runs[["dataset", "scenario"]].drop_duplicates().itertuples(index=False)
    by_dataset: dict[str, list[str]] = {}
    for ds, sc in pairs:
        by_dataset.setdefault(ds, []).append(sc)
    out = {}
    for ds, scs in by_dataset.items():
        first = Scenario.TASK_IL if Scenario.TASK_IL in scs else sorted(scs)[0]
        out.update({(ds, sc): ds if sc == first else f"{ds} · {sc}" for sc in scs})
    return out


def relabelled(t: AnalysisResult, labels: dict[tuple[str, str], str]) -> AnalysisResult:
    """The tables with each (dataset, scenario) row's dataset named by its panel label (panel_labels)."""
    if all(label == ds for (ds, _), label in labels.items()):
        return t
    cut = {}
    for name, df in [("runs", t.runs), *t.tables().items()]:
        if {"dataset", "scenario"} <= set(df.columns) and len(df):
            keys = zip(df["dataset"], df["scenario"])
            cut[name] = df.assign(dataset=[labels.get(k, k[0]) for k in keys])
    return replace(t, **cut)


def _base(t: AnalysisResult, records: list[RunRecord], **settings) -> dict:
    """What every page shows or needs: protocol, data sets, methods, regimes and their colours."""
    frame = t.runs
    regimes = regime_order(frame)
    methods = sorted(frame["method"].unique())
    colours = charts.regime_colours(regimes)
    return {"protocol": _protocol(records), "scale": percent_scale(frame), "regimes": regimes,
            "regime_colour": colours, "regime_info": _regime_info(t), "assets": assets(colours),
            "method_colour": {m: charts.METHOD_COLOURS[i % len(charts.METHOD_COLOURS)] for i, m in enumerate(methods)},
            "datasets": sorted(frame["dataset"].unique()), "methods": methods, "flag": FLAG,
            "warning_text": WARNINGS, "scenarios": sorted({r.spec.scenario for r in records}),
            # the Bayesian comparison's settings, as the analysis used them: "ROPE 1 ACC point", the credible level
            "rope_text": rope_text(t.settings.rope_points), "credible_level": t.settings.credible, **settings}


def _protocol(records) -> dict:
    names = sorted({r.spec.protocol for r in records})
    versions = sorted({r.spec.protocol_version for r in records})
    return {"name": ", ".join(names), "version": ", ".join(versions), "cli_name": names[0] if names else ""}


def _regime_info(t: AnalysisResult) -> dict[str, dict]:
    """Per regime: its family, the median trainable fraction and count over data sets, and each
    data set's own (backbones differ between data sets, so do their fractions)."""
    out = {}
    for rg, sub in t.regimes.groupby("regime", sort=False):
        per = [{"dataset": r["dataset"], "fraction": r["fraction"], "trainable": r["trainable"], "total": r["total"]}
               for r in charts.records_of(sub)]
        out[rg] = {"family": str(sub["family"].iloc[0]), "fraction": charts.clean(float(sub["fraction"].median())),
                   "trainable": charts.clean(float(sub["trainable"].median())), "per_dataset": per,
                   "same": len({(r["fraction"], r["trainable"]) for r in per}) <= 1}
    return out
