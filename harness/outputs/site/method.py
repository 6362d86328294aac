"""View-model of a method page: what the adapter is, its per-regime results, diagnostics and sweeps, its runs."""
from __future__ import annotations

import json
from pathlib import Path

from ...analysis.diagnostics import Sweep, diagnostic_means, sweeps
from ...analysis.result import AnalysisResult
from .. import charts
from ..charts import records_of
from ..formatting import slug
from .anytime import method_columns
from .writer import SiteWriter

RUN_COLUMNS = ["run_id", "dataset", "scenario", "regime", "order", "seed", "status", "acc", "acc_task_aware",
               "forgetting", "optimizer_steps", "memory_samples", "memory_bytes", "n_warnings", "warning_codes"]


def page(w: SiteWriter, t: AnalysisResult, records, m: str, infos: dict) -> Path:
    """Render method-<slug>.html for method m (its display name); returns its path."""
    mine = [r for r in records if r.method == m]
    hparams = sorted({json.dumps(r.spec.hparams, sort_keys=True, default=str) for r in mine})
    subs = sorted({json.dumps(r.submission, sort_keys=True) for r in mine if r.submission})
    mt = t.methods[t.methods["method"] == m]
    names = sorted({r.spec.method for r in mine})
    captions = {k: v for n in names for k, v in (infos.get(n, {}).get("captions") or {}).items()}
    about = [{"name": n, "description": str(infos[n].get("description") or ""),
              "reference": str(infos[n].get("reference") or "")} for n in names if n in infos]
    regimes = w.base["regimes"]
    diagnostics = [{"name": d.name, "rows": d.rows, "width": d.width, "caption": caption(d.name, captions)}
                   for d in diagnostic_means(mine, regimes)]
    ctx = {"title": m, "method": m, "names": names, "about": about,
           "hparams": [json.loads(h) for h in hparams], "submissions": [json.loads(s) for s in subs],
           "rows": records_of(mt), "diagnostics": diagnostics,
           # class-IL rows: class-IL ACC, task-aware ACC and forgetting side by side; memory where declared
           "task_aware": bool(mt["acc_task_aware"].notna().any()),
           "memory": bool(mt[["memory_samples", "memory_bytes"]].notna().any().any()),
           "anytime_cols": method_columns(mt),  # gap depth, min-ACC, WC-ACC next to ACC where runs have curves
           "sweeps": sweep_panels(sweeps(mine, regimes), w.base["scale"], captions),
           "runs": records_of(t.runs[t.runs["method"] == m][RUN_COLUMNS]),
           "downloads": {"per-regime results": w.table(mt, f"method-{slug(m)}")}}
    return w.page("method.html", f"method-{slug(m)}.html", **ctx)


def method_infos() -> dict[str, dict]:
    """Adapter metadata by registry name (api.index: no torch import when cached); {} if unavailable."""
    from ...api.index import method_infos as infos

    try:
        return {m["name"]: m for m in infos()}
    except Exception:  # a broken submission must not stop the site: descriptions are decoration
        return {}


def caption(name: str, captions: dict) -> str:
    """The caption of a diagnostic series `key`, `key[i]`, `key.sub` or `key (mean of n)`."""
    base = name.split("[")[0].split(" (")[0].split(".")[0]
    return captions.get(name) or captions.get(base, "")


def sweep_panels(found: list[Sweep], scale: float, captions: dict | None = None) -> list[dict]:
    """Each sweep as a chart panel with its per-task table (charts.sweep_panel) and caption."""
    return [{"key": s.key, "dataset": s.dataset, "regime": s.regime, "caption": caption(s.key, captions or {}),
             **charts.sweep_panel(s, scale)} for s in found]
