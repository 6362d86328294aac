"""View-model of a method page: what the adapter is, its per-regime results, diagnostics and sweeps, its runs."""
from __future__ import annotations

import json
from pathlib import Path, PurePath

from ...analysis.diagnostics import DiagnosticTable, Sweep, diagnostic_tables, sweeps
from ...analysis.result import AnalysisResult
from .. import charts
from ..charts import records_of
from ..formatting import slug
from .anytime import method_columns
from .writer import SiteWriter

RUN_COLUMNS = ["run_id", "dataset", "scenario", "regime", "order", "seed", "status", "acc", "acc_task_aware",
               "forgetting", "optimizer_steps", "memory_samples", "memory_bytes", "n_warnings", "warning_codes"]


# What a method's code is, as its page says it (provenance["method"]["kind"] -> label).
KIND_LABELS = {"built-in": "built-in", "file": "submitted file", "entry point": "entry point"}


def page(w: SiteWriter, t: AnalysisResult, records, m: str, infos: dict) -> Path:
    """Render method-<slug>.html for method m (its display name); returns its path."""
    mine = [r for r in records if r.method == m]
    hparams = sorted({json.dumps(r.spec.hparams, sort_keys=True, default=str) for r in mine})
    mt = t.methods[t.methods["method"] == m]
    names = sorted({r.spec.method for r in mine})
    about = implementations(mine, infos)
    captions = {k: v for a in about for k, v in a["captions"].items()}
    types = {k: v for a in about for k, v in a["types"].items()}
    regimes = w.base["regimes"]
    n_tasks = max((r.spec.dataset.n_tasks for r in mine), default=0)
    ctx = {"title": m, "method": m, "names": names, "about": about,
           "hparams": [hparam_rows(json.loads(h), types) for h in hparams],
           "rows": records_of(mt),
           "diagnostics": [diagnostic_view(d, captions, n_tasks) for d in diagnostic_tables(mine, regimes)],
           # class-IL rows: class-IL ACC, task-aware ACC and forgetting side by side; memory where declared
           "task_aware": bool(mt["acc_task_aware"].notna().any()),
           "memory": bool(mt[["memory_samples", "memory_bytes"]].notna().any().any()),
           "anytime_cols": method_columns(mt),  # gap depth, min-ACC, WC-ACC next to ACC where runs have curves
           "sweeps": sweep_panels(sweeps(mine, regimes), w.base["scale"], captions),
           "runs": records_of(t.runs[t.runs["method"] == m][RUN_COLUMNS]),
           "downloads": {"per-regime results": w.table(mt, f"method-{slug(m)}")}}
    return w.page("method.html", f"method-{slug(m)}.html", **ctx)


def implementations(records, infos: dict) -> list[dict]:
    """What the method's code is, once per (registry name, implementation) among its records.

    Read from each record's provenance["method"] (written at run time: nothing is imported, so a board
    of another lab's records runs none of its code). An older record without it falls back to the
    built-in index (`infos`) for a built-in, and to what its provenance says for a file.
    """
    found: dict = {}
    for r in records:
        prov = r.provenance if isinstance(r.provenance, dict) else {}
        entry = prov.get("method") if isinstance(prov.get("method"), dict) else {}
        key = (r.spec.method, r.spec.method_version or str(entry.get("implementation", "")))
        if r.spec.method_version:  # the run id's identity of the code, not the provenance's word for it
            entry = {**entry, "implementation": r.spec.method_version}
        if key not in found or ("description" in entry and not found[key]["recorded"]):
            found[key] = about(r.spec.method, entry, prov.get("submission"), infos)
    return [found[k] for k in sorted(found)]


def about(name: str, entry: dict, submission, infos: dict) -> dict:
    """One implementation of a method as its page shows it (everything read back as text: untrusted)."""
    implementation = _text(entry.get("implementation"))
    kind = entry.get("kind") if entry.get("kind") in KIND_LABELS else _kind(entry.get("source"), implementation)
    # the run id's implementation decides, not the record's word: a built-in is a version, never a hash, and
    # a version of a name this harness ships is its built-in (a record calling it a file cannot relabel it)
    if implementation.startswith("sha256:"):
        kind = "entry point" if kind == "entry point" else "file"
    elif name in infos or kind == "built-in":
        kind = "built-in"
    recorded = "description" in entry
    # a built-in's text is this harness's own (its index), never a record's: records are data another lab wrote
    meta = infos.get(name, {}) if kind == "built-in" else entry if recorded else {}
    submission = submission if isinstance(submission, dict) else {}
    source = _text(submission.get("file") or (entry.get("source") if kind == "file" else ""))
    captions = meta.get("captions") if isinstance(meta.get("captions"), dict) else {}
    hparams = entry.get("hparams") if isinstance(entry.get("hparams"), dict) else {}
    return {"name": name, "kind": kind, "label": KIND_LABELS[kind], "implementation": implementation,
            "sha256": _digest(entry.get("sha256") or submission.get("sha256"), implementation),
            "file": PurePath(source).name if source else "",  # the name only: the path is the runner's machine
            "submitted": bool(submission), "recorded": recorded,
            "description": _text(meta.get("description")), "reference": _text(meta.get("reference")),
            "captions": {_text(k): _text(v) for k, v in captions.items()},
            "types": {_text(k): " | ".join(map(_text, v["type"])) or "any" for k, v in hparams.items()
                      if isinstance(v, dict) and isinstance(v.get("type"), list)}}


def _kind(source, implementation: str) -> str:
    """An older record's kind: from its provenance source, else from its implementation (a hash: a file)."""
    if source == "built-in":
        return "built-in"
    if isinstance(source, str) and source:
        return "entry point" if source.startswith("entry point ") else "file"
    return "file" if implementation.startswith("sha256:") else "built-in"


def _digest(value, implementation: str) -> str:
    """A code sha256 the record states, shown only where it is the code its implementation names."""
    text = _text(value, 64)
    named = implementation[7:].split("+")[0] if implementation.startswith("sha256:") else ""
    return text if text and (not named or text.startswith(named)) else ""


def _text(value, limit: int = 2000) -> str:
    """A read-back value as bounded text (escaped by the template, never marked safe)."""
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def hparam_rows(values: dict, types: dict) -> list[dict]:
    """One hyperparameter set as rows: name, value, type (as recorded; "" where the records do not say)."""
    return [{"name": k, "value": v, "type": types.get(k, "")} for k, v in values.items()]


def diagnostic_view(d: DiagnosticTable, captions: dict, n_tasks: int) -> dict:
    """One diagnostic key as one table: a row per (series, dataset, regime); a scalar in the `value`
    column, a per-task series under t1..tT (positions 1..W where it is longer than the runs' tasks)."""
    width = d.width
    labels = [f"t{i + 1}" if width <= n_tasks else str(i + 1) for i in range(width)]
    rows = []
    for series in d.series:
        scalar = series.name in d.scalars
        sub = series.name[len(d.key):].lstrip(". ")
        for r in series.rows:
            values = [] if scalar else list(r.values) + [None] * (width - len(r.values))
            rows.append({"label": sub, "caption": captions.get(series.name, "") if sub else "",
                         "dataset": r.dataset, "regime": r.regime, "n": r.n,
                         "value": r.values[0] if scalar else None, "values": values,
                         "spark": [] if scalar else list(r.values)})
    return {"name": d.key, "caption": caption(d.key, captions), "rows": rows, "labels": labels,
            "has_value": bool(d.scalars), "has_label": any(row["label"] for row in rows)}


def method_infos() -> dict[str, dict]:
    """Built-in adapters' metadata by registry name (the shipped index: no method file is imported); {} if
    unavailable. For records made before provenance["method"] carried it."""
    from ...api.index import builtin_infos

    try:
        return {m["name"]: m for m in builtin_infos()}
    except Exception:  # descriptions are decoration: a broken index must not stop the site
        return {}


def caption(name: str, captions: dict) -> str:
    """The caption of a diagnostic series `key`, `key[i]`, `key.sub` or `key (mean of n)`."""
    base = name.split("[")[0].split(" (")[0].split(".")[0]
    return captions.get(name) or captions.get(base, "")


def sweep_panels(found: list[Sweep], scale: float, captions: dict | None = None) -> list[dict]:
    """Each sweep as a chart panel with its per-task table (charts.sweep_panel) and caption."""
    return [{"key": s.key, "dataset": s.dataset, "regime": s.regime, "caption": caption(s.key, captions or {}),
             **charts.sweep_panel(s, scale)} for s in found]
