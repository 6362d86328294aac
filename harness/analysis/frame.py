"""Records to a tidy pandas frame, plus the end-of-sweep summary."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..config.metrics import ANYTIME_NAMES, METRIC_NAMES, anytime_of_record
from ..config.specs import RunRecord
from ..config.text import terminal_safe
from ..config.vocabulary import WARNINGS, Scenario, Status, regime_sort_key, written_family

# `ranked`: the run enters the rank statistics (ok, and not flagged unless flagged runs are
# included); it is the one place that policy is decided, every unit matrix reads it.
# budget.compute (harness/run/compute.py), NaN for a record without it ("not measured", never 0): forward and
# backward sample-passes at the model, their sum, training FLOPs, peak resident memory, the merge's seconds
COMPUTE_COLUMNS = ("forward_samples", "backward_samples", "sample_passes", "flops", "peak_rss_bytes", "merge_s")
COLUMNS = ("run_id", "status", "error", "protocol", "protocol_version", "dataset", "scenario",
           "regime", "family", "regime_depth", "n_blocks", "method", "method_name", "order", "seed",
           *METRIC_NAMES, "mean_update_norm", "drift", "acc_task_aware", "forgetting_task_aware",
           "trainable_params", "total_params", "trainable_fraction", "total_s", "is_submission",
           "optimizer_steps", "samples_seen", "memory_samples", "memory_bytes", *COMPUTE_COLUMNS, "n_warnings",
           "warning_codes", "flagged", "has_curve", *ANYTIME_NAMES, "ranked")
# has_curve: the record carries a continual-evaluation curve; the ANYTIME_NAMES columns are its any-time
# metrics (config/metrics.py ANYTIME), computed on read from the curve the store verified; NaN without a
# curve, and for a run that did not finish (its curve stops where it failed).
FLAG = "⚑"  # marks cells with flagged runs, in the terminal summary and on the site


def _num(x) -> float:
    """A float, or NaN for None / non-numbers (nothing is imputed, NaN stays NaN)."""
    if isinstance(x, bool) or x is None:
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _last(values) -> float:
    """The last entry of a per-task list (what a method keeps after the final task); NaN when the
    list is missing or empty (a method that declares no memory), or its last entry is."""
    return _num(values[-1]) if isinstance(values, (list, tuple)) and values else math.nan


def _mean_norm(shared) -> float:
    vals = [_num(v) for v in (shared or [])]
    vals = [v for v in vals if not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


def family_of(regime) -> str:
    """The regime's family (depth, bitfit, norm, lora or a plug-in's, read from the name whether or not
    the plug-in is loaded here); `other` for a name outside the grammar."""
    return written_family(regime) or "other"


def _fraction(params: dict) -> float:
    """The recorded trainable fraction, else trainable / total (NaN when either is unknown)."""
    if "fraction" in params:
        return _num(params["fraction"])
    trainable, total = _num(params.get("trainable")), _num(params.get("total"))
    return trainable / total if total > 0 else math.nan  # NaN > 0 is False: unknown stays NaN


def warning_codes(warnings) -> list[str]:
    """Sorted unique codes of a record's warnings (entries without a code are skipped)."""
    return sorted({str(w["code"]) for w in warnings or [] if isinstance(w, dict) and w.get("code")})


def _row(rec: RunRecord) -> dict:
    spec = rec.spec
    metrics, norms, params = rec.metrics or {}, rec.update_norms or {}, rec.params or {}
    budget = rec.budget or {}
    return {
        "run_id": rec.run_id, "status": rec.status, "error": rec.error,
        "protocol": spec.protocol, "protocol_version": spec.protocol_version,
        "dataset": rec.dataset, "scenario": str(spec.scenario), "regime": spec.regime, "family": family_of(spec.regime),
        "regime_depth": _num(rec.regime_depth), "n_blocks": _num(rec.n_blocks),
        "method": rec.method, "method_name": spec.method, "order": int(spec.order), "seed": int(spec.seed),
        **{m: _num(metrics.get(m)) for m in METRIC_NAMES},
        "mean_update_norm": _mean_norm(norms.get("shared")),
        "drift": _num(norms.get("drift")),
        # class-IL runs only: their task-aware (masked) ACC and forgetting; NaN in task-IL
        "acc_task_aware": _num((rec.metrics_task_aware or {}).get("acc")),
        "forgetting_task_aware": _num((rec.metrics_task_aware or {}).get("forgetting")),
        "trainable_params": _num(params.get("trainable")),
        "total_params": _num(params.get("total")),
        "trainable_fraction": _fraction(params),
        "total_s": _num((rec.timings or {}).get("total_s")),
        "is_submission": bool(rec.submission),
        "optimizer_steps": _num(budget.get("optimizer_steps")),
        "samples_seen": _num(budget.get("samples_seen")),
        # what the method keeps between tasks after the last one (MemoryHook); NaN when it declares nothing
        "memory_samples": _last(budget.get("memory_samples")),
        "memory_bytes": _last(budget.get("memory_bytes")),
        **_compute(budget.get("compute"), rec.timings or {}, (rec.provenance or {}).get("memory")),
        "n_warnings": len(rec.warnings or []),
        "warning_codes": ",".join(warning_codes(rec.warnings)),
        "flagged": rec.flagged,
        "has_curve": rec.curve is not None,
        **_anytime(rec),
    }


def _compute(c, timings: dict, memory) -> dict:
    """The record's compute columns (budget.compute; peak memory from provenance.memory, the merge's seconds from
    timings); every one NaN without budget.compute (not measured)."""
    if not isinstance(c, dict):
        return dict.fromkeys(COMPUTE_COLUMNS, math.nan)
    fwd, bwd = _num(c.get("forward_samples")), _num(c.get("backward_samples"))
    memory = memory if isinstance(memory, dict) else {}
    return {"forward_samples": fwd, "backward_samples": bwd, "sample_passes": fwd + bwd, "flops": _num(c.get("flops")),
            "peak_rss_bytes": _num(memory.get("peak_rss_bytes")), "merge_s": _num(timings.get("merge_s", 0.0))}


def _anytime(rec: RunRecord) -> dict:
    """The any-time metrics of a finished run's curve (NaN each without one, or where undefined)."""
    if rec.curve is None or rec.status != Status.OK:
        return dict.fromkeys(ANYTIME_NAMES, math.nan)
    return {k: _num(v) for k, v in anytime_of_record(rec.curve).items()}


def ranked_runs(frame: pd.DataFrame, include_flagged: bool = False) -> pd.Series:
    """Mask of the runs rank statistics use: ok ones, flagged ones only when included."""
    ok = frame["status"] == Status.OK
    return ok if include_flagged else ok & ~frame["flagged"].astype(bool)


def records_to_frame(records, include_flagged: bool = False) -> pd.DataFrame:
    """One row per record (failed runs included, their metrics NaN); `ranked` per include_flagged."""
    frame = pd.DataFrame([_row(r) for r in records], columns=list(COLUMNS))
    frame = frame.astype({"order": "int64", "seed": "int64", "is_submission": "bool",
                          "n_warnings": "int64", "flagged": "bool", "has_curve": "bool"})
    return frame.assign(ranked=ranked_runs(frame, include_flagged).astype(bool))


def regime_order(frame: pd.DataFrame) -> list[str]:
    """Regimes by median trainable fraction (smallest first); ties and unknown fractions (last)
    by regime_sort_key. A depth protocol keeps head < last-1 < ... < full."""
    if frame.empty:
        return []
    # Frames from before trainable_fraction existed order by depth, as they did then.
    key = "trainable_fraction" if "trainable_fraction" in frame else "regime_depth"
    size = frame.groupby("regime")[key].median()
    return sorted(size.index, key=lambda r: (_nan_last(size[r]), regime_sort_key(r)))


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else float(x)


def ok_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs that finished with status ok (the only ones statistics use)."""
    return frame[frame["status"] == Status.OK]


def percent_scale(frame: pd.DataFrame) -> float:
    """100 when accuracies are stored as fractions in [0, 1], else 1 (already percent)."""
    acc = frame[["acc", "la"]].abs().max().max() if len(frame) else math.nan
    return 1.0 if (not math.isnan(acc) and acc > 1.5) else 100.0


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and scenario, method x regime: mean ACC (and, for class-IL runs, task-aware ACC) and
    forgetting over ok runs, n ok, n not-ok, n flagged. Task-IL and class-IL runs are never one cell."""
    cols = ["dataset", "scenario", "method", "regime", "acc", "acc_task_aware", "forgetting", "n", "n_failed",
            "n_flagged"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    keys = ["dataset", "scenario", "method", "regime"]
    ok = frame["status"] == Status.OK
    g = frame.assign(n=ok.astype(int), n_failed=(~ok).astype(int), n_flagged=frame["flagged"].astype(int),
                     acc=frame["acc"].where(ok), forgetting=frame["forgetting"].where(ok),
                     acc_task_aware=frame["acc_task_aware"].where(ok))
    out = g.groupby(keys, sort=False).agg(acc=("acc", "mean"), acc_task_aware=("acc_task_aware", "mean"),
                                         forgetting=("forgetting", "mean"), n=("n", "sum"),
                                         n_failed=("n_failed", "sum"), n_flagged=("n_flagged", "sum"))
    out = out.reset_index()
    rank = {r: i for i, r in enumerate(regime_order(frame))}
    out["_r"] = out["regime"].map(rank)
    out = out.sort_values(["dataset", "scenario", "method", "_r"], kind="stable").drop(columns="_r")
    return out[cols].reset_index(drop=True)


def format_summary(frame: pd.DataFrame) -> str:
    """Compact plain-text table: per dataset (and scenario), method rows x regime columns, 'ACC/F (n)' in %;
    class-IL cells 'ACC/TA/F (n)' with TA the task-aware ACC of the same runs."""
    table = summary_table(frame)
    if table.empty:
        return "no runs"
    scale = percent_scale(frame)
    regimes = regime_order(frame)
    scenarios = set(table["scenario"])
    lines = ["cells: ACC % / forgetting % (ok runs[, !failed]); mean over task orders and seeds"]
    if Scenario.CLASS_IL in scenarios:
        lines.append("class-IL cells: class-IL ACC % / task-aware ACC % (TA, same runs) / forgetting %")
    for (ds, sc), sub in table.groupby(["dataset", "scenario"], sort=True):
        head = f"dataset: {ds}" + (f" ({sc})" if len(scenarios) > 1 else "")
        lines += ["", terminal_safe(head), *_dataset_lines(sub, regimes, scale, sc == Scenario.CLASS_IL)]
    return "\n".join(lines + _flag_footer(frame))


def _flag_footer(frame: pd.DataFrame) -> list[str]:
    """What the flag mark means, whether flagged runs were ranked, and the codes seen."""
    flagged = frame[frame["flagged"]]
    if flagged.empty:
        return []
    policy = ("ranked anyway (--include-flagged)" if flagged["ranked"].any()
              else "left out of rankings (--include-flagged ranks them)")
    codes = sorted({c for cs in flagged["warning_codes"] for c in cs.split(",") if c})
    # Codes come from the records: an unknown one is shown (escaped) without a meaning.
    return ["", f"{FLAG}N: N runs with learning-check warnings; {policy}",
            *(terminal_safe(f"  {c}: {WARNINGS[c]}" if c in WARNINGS else f"  {c}") for c in codes)]


def _dataset_lines(sub: pd.DataFrame, regimes, scale: float, task_aware: bool = False) -> list[str]:
    """Header and one line per method; labels come from user files, so they are escaped first."""
    cells = {(r.method, r.regime): _cell(r, scale, task_aware) for r in sub.itertuples()}
    present = [r for r in regimes if r in set(sub["regime"])]
    methods = list(dict.fromkeys(sub["method"]))
    rows = [["method", *map(terminal_safe, present)]]
    rows += [[terminal_safe(m), *(cells.get((m, r), "-") for r in present)] for m in methods]
    # Widths from the escaped text: that is what the terminal shows, so the columns line up.
    width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [_fmt_line(row, width) for row in rows]


def _cell(r, scale: float, task_aware: bool = False) -> str:
    acc = _pct(r.acc, scale) + (f"/{_pct(r.acc_task_aware, scale)}" if task_aware else "")
    failed = f", !{r.n_failed}" if r.n_failed else ""
    flag = f" {FLAG}{r.n_flagged}" if r.n_flagged else ""
    return f"{acc}/{_pct(r.forgetting, scale)} ({r.n}{failed}){flag}"


def _pct(x: float, scale: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * scale:.1f}"


def _fmt_line(items, width) -> str:
    return "  ".join(str(s).ljust(w) for s, w in zip(items, width)).rstrip()
