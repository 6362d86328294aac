"""View-model of a run page: one record's accuracy matrices, metrics, budget, norms, diagnostics, provenance."""
from __future__ import annotations

import json
from pathlib import Path

from ...analysis.diagnostics import named_entries, series, sweeps
from ...config.metrics import anytime_of_record
from ...config.numbers import is_number
from ...config.specs import RunRecord
from ...config.vocabulary import WARNINGS, Status
from ...execution.reproduce import reproduce_command, sweep_commands
from .. import charts
from ..formatting import num, slug
from . import contributors
from .method import sweep_panels
from .writer import SiteWriter


def page(w: SiteWriter, rec: RunRecord, dataset: str | None = None) -> Path:
    """Render runs/<slug>.html for one record; returns its path. dataset: the name of its data set's
    page (the site's panel label), default the record's data set."""
    rid = rec.run_id
    norms = rec.update_norms or {}
    ctx = {"title": f"run {rid}", "rec": rec, "spec": rec.spec.to_dict(),
           "cmd": reproduce_command(rid, w.base["results_dir"], rec),
           "sweep_cmd": _sweep_cmd(w, rec),
           "method": rec.method, "dataset": rec.dataset if dataset is None else dataset,
           "matrices": _matrices(rec), "metric_rows": _metric_rows(rec), "anytime": _curves(rec, w.base["scale"]),
           "anytime_rows": _anytime_rows(rec),
           "norm_rows": _norm_rows(norms), "shared": series(norms.get("shared")) or [],
           "diagnostics": _diagnostics(rec),
           "sweeps": sweep_panels(sweeps([rec], w.base["regimes"]), w.base["scale"]),
           "timings": _timings(rec.timings or {}), "provenance": _provenance(rec.provenance or {}),
           "warnings": _warning_rows(rec.warnings), "budget": _budget_rows(rec.budget or {}, rec.timings or {},
                                                                            (rec.provenance or {}).get("memory")),
           "source": contributors.of_run(w.base["sources"], rid)}
    return w.page("run.html", f"runs/{slug(rid)}.html", **ctx)


def _sweep_cmd(w: SiteWriter, rec: RunRecord) -> str | None:
    """The sweep that made a local record; none for a bundle's (its protocol copy is not in this results folder:
    the page points to `cl-bench verify BUNDLE` instead)."""
    src = (w.base["sources"] or {}).get(rec.run_id)
    if not w.base["results_dir"] or (src is not None and src.bundle):
        return None
    return (sweep_commands([rec], w.base["results_dir"]) or [None])[0]


def _matrices(rec: RunRecord) -> list[dict]:
    """The accuracy matrix; for a class-IL run also the task-aware (masked) one, labelled."""
    aware = getattr(rec, "acc_matrix_task_aware", None)
    if aware is None:
        return [{"label": "", "m": charts.matrix_cells(rec.acc_matrix or []), "slug": "accuracy-matrix"}]
    return [{"label": "class-IL (no task id at test time)", "m": charts.matrix_cells(rec.acc_matrix or []),
             "slug": "accuracy-matrix-class-il"},
            {"label": "task-aware (predictions masked to the task's classes)", "m": charts.matrix_cells(aware),
             "slug": "accuracy-matrix-task-aware"}]


def _curves(rec: RunRecord, scale: float) -> list[dict]:
    """The run's continual-evaluation curve as charts: class-IL and task-aware for a class-IL run; [] without one."""
    curve = getattr(rec, "curve", None)
    if not isinstance(curve, dict):
        return []
    aware = curve.get("acc_task_aware") is not None
    out = [{"label": "class-IL (no task id at test time)" if aware else "", "slug": "curve",
            "chart": charts.run_curve(curve, scale)}]
    if aware:
        out.append({"label": "task-aware (predictions masked to the task's classes)", "slug": "curve-task-aware",
                    "chart": charts.run_curve(curve, scale, "acc_task_aware")})
    return [c for c in out if c["chart"] is not None]


def _anytime_rows(rec: RunRecord) -> list[dict]:
    """The run's any-time metrics (config/metrics.py ANYTIME) from its curve, per accuracy (class-IL and
    task-aware for a class-IL run); [] without a curve, for a run that did not finish (as in the frame: its
    partial curve is drawn, not summarised), or one these metrics cannot read."""
    curve = getattr(rec, "curve", None)
    if not isinstance(curve, dict) or rec.status != Status.OK:
        return []
    keys = [("acc", "class-IL" if curve.get("acc_task_aware") is not None else "")]
    keys += [("acc_task_aware", "task-aware")] if curve.get("acc_task_aware") is not None else []
    rows = []
    for key, label in keys:
        try:
            values = anytime_of_record(curve, key)
        except (ValueError, KeyError, TypeError):  # a curve the store let through but the metrics refuse: no row
            continue
        rows.append({"label": label, "values": values})
    return rows


def _metric_rows(rec: RunRecord) -> list[dict]:
    """Per-run metrics (and, for class-IL runs, their task-aware counterparts) as labelled rows."""
    rows = [{"label": "class-IL" if getattr(rec, "acc_matrix_task_aware", None) is not None else "",
             "metrics": rec.metrics or {}}]
    aware = getattr(rec, "metrics_task_aware", None)
    if isinstance(aware, dict) and aware:
        rows.append({"label": "task-aware", "metrics": aware})
    keys = list(dict.fromkeys(k for r in rows for k in r["metrics"]))
    return [{**r, "keys": keys} for r in rows if r["metrics"]]


def _timings(timings: dict) -> list[tuple[str, str]]:
    """Timings as (name, text): seconds to 2 decimals, per-task lists joined."""
    out = []
    for k, v in timings.items():
        if is_number(v):
            out.append((k, num(v, 2)))
        elif isinstance(v, list):
            out.append((k, ", ".join(num(x, 2) for x in v)))
        else:
            out.append((k, json.dumps(v, default=str)))
    return out


def _diagnostics(rec: RunRecord) -> dict:
    """The run's numeric diagnostics as one aligned table: a number in `value`, a per-task list under
    t1..tT (positions 1..W where longer than the run's tasks)."""
    entries = named_entries(rec.diagnostics)
    width = max((len(s) for _, _, s, scalar in entries if not scalar), default=0)
    tasks = rec.spec.dataset.n_tasks
    rows = [{"name": name, "value": s[0] if scalar else None,
             "values": [] if scalar else s + [None] * (width - len(s)), "spark": [] if scalar else s}
            for _, name, s, scalar in entries]
    return {"rows": rows, "has_value": any(scalar for *_, scalar in entries),
            "labels": [f"t{i + 1}" if width <= tasks else str(i + 1) for i in range(width)]}


# Shown on the method page; the run page keeps the identity of the code that ran.
METHOD_SUMMARY = ("kind", "name", "implementation", "sha256", "source")


def _provenance(prov: dict) -> list[dict]:
    """Provenance rows: text, a flat mapping as inline pairs, anything nested as a JSON box; the method
    by its identity (its description, captions and hyperparameters are on the method page)."""
    rows = []
    for k, v in prov.items():
        if k == "method" and isinstance(v, dict):
            v = {kk: v[kk] for kk in METHOD_SUMMARY if kk in v}
        if isinstance(v, dict) and all(not isinstance(x, (dict, list)) for x in v.values()):
            rows.append({"key": k, "pairs": [(kk, "" if vv is None else str(vv)) for kk, vv in v.items()]})
        elif isinstance(v, (dict, list)):
            rows.append({"key": k, "json": v})
        else:
            rows.append({"key": k, "text": "" if v is None else str(v)})
    return rows


def _warning_rows(warnings: list) -> list[dict]:
    """A record's warnings with 1-based task numbers and each code's meaning."""
    return [{"task": w["task"] + 1 if is_number(w.get("task")) else None, "code": str(w.get("code", "")),
             "meaning": WARNINGS.get(w.get("code"), ""), "message": str(w.get("message", ""))}
            for w in warnings or [] if isinstance(w, dict)]


def _budget_rows(budget: dict, timings: dict | None = None, memory: dict | None = None) -> dict:
    """Totals and per-task steps, samples, epochs per training stage and kept memory of a record's budget."""
    per = [budget.get(k) if isinstance(budget.get(k), list) else [] for k in
           ("steps_per_task", "samples_per_task", "epochs_per_stage", "memory_samples", "memory_bytes")]
    tasks = [{"task": t + 1, "steps": _at(per[0], t), "samples": _at(per[1], t),
              "stages": _stages(_at(per[2], t)), "memory_samples": _at(per[3], t), "memory_bytes": _at(per[4], t)}
             for t in range(max(map(len, per)))]
    return {"steps": budget.get("optimizer_steps"), "samples": budget.get("samples_seen"), "tasks": tasks,
            "memory": bool(per[3] or per[4]),
            "compute": _compute_rows(budget.get("compute"), len(tasks), timings or {}, memory)}


def _compute_rows(c, n_tasks: int, timings: dict, memory) -> dict | None:
    """budget.compute as the run page shows it, with the merge's and accounting's seconds (timings) and the peak
    memory (provenance.memory); None: not measured. Per task: forward and backward passes."""
    if not isinstance(c, dict):
        return None
    fwd, bwd = (c.get(k) if isinstance(c.get(k), list) else [] for k in ("forward_per_task", "backward_per_task"))
    merge = c.get("merge") if isinstance(c.get("merge"), dict) else None
    memory = memory if isinstance(memory, dict) else {}
    return {"forward": c.get("forward_samples"), "backward": c.get("backward_samples"), "flops": c.get("flops"),
            "peak_rss": memory.get("peak_rss_bytes"), "cuda_peak": memory.get("cuda_peak_bytes"),
            "seconds": {k: timings.get(k) for k in ("train_s", "eval_s", "merge_s", "accounting_s")}, "merge": merge,
            "per_task": [(_at(fwd, t), _at(bwd, t)) for t in range(max(n_tasks, len(fwd)))]}


def _stages(epochs) -> str:
    """Epochs of a task's training stages as "1 + 1" (one stage: "2")."""
    return " + ".join(map(str, epochs)) if isinstance(epochs, list) else ("" if epochs is None else str(epochs))


def _at(seq: list, i: int):
    """seq[i], or None past its end (a failed run's budget stops at its last task)."""
    return seq[i] if i < len(seq) else None


def _norm_rows(norms: dict) -> list[tuple[str, list]]:
    rows = [(k, series(norms.get(k))) for k in ("shared", "relative", "step_forgetting")]
    rows += [(f"block {b}", series(v)) for b, v in (norms.get("per_block") or {}).items()]
    return [(k, v) for k, v in rows if v is not None]
