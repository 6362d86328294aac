"""Method diagnostics across runs (pure): what adapters record beyond the metrics, aggregated.

A diagnostic is whatever an adapter put in `record.diagnostics`: a number, a list of numbers (one
per task), a list of such lists, a dict of those, a per-task list of dicts, or a sweep (per task,
a grid of {parameter: x, quantity: y} points, as BECAME's alpha_sweep). `named_series` flattens one
record's into named number series; `diagnostic_means` averages them over ok runs per (dataset,
regime); `sweeps` gathers sweeps per (key, dataset, regime) for their mean curves. Only ok runs count.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.numbers import is_number
from ..config.specs import RunRecord


@dataclass(frozen=True)
class SeriesMean:
    """One diagnostic series of one (dataset, regime): its mean over n ok runs, element by element."""

    dataset: str
    regime: str
    n: int
    values: list  # floats; None where no run has a number at that position


@dataclass(frozen=True)
class DiagnosticMeans:
    """One named diagnostic series, averaged per (dataset, regime)."""

    name: str  # `key`, `key[i]`, `key.sub` or `key (mean of n)`: see named_series
    rows: tuple[SeriesMean, ...]  # data sets sorted, regimes in the given order

    @property
    def width(self) -> int:
        """The longest series' length (its tasks)."""
        return max(len(r.values) for r in self.rows)


@dataclass(frozen=True)
class DiagnosticTable:
    """The series of one top-level diagnostic key (a dict's entries, a list of lists' rows) as one table."""

    key: str
    series: tuple[DiagnosticMeans, ...]  # names sorted
    scalars: frozenset  # names of series that are one number per run (their own column, not t1)

    @property
    def width(self) -> int:
        """The longest per-task series' length (0 when every series is a scalar)."""
        return max((d.width for d in self.series if d.name not in self.scalars), default=0)


@dataclass(frozen=True)
class TaskSweep:
    """One task's sweeps over n runs: every run's y at each grid x, and its recorded scalars."""

    n: int
    points: dict  # x (rounded to 1e-9) -> [y of each run]
    marks: dict  # scalar recorded next to the grid (the chosen x, the closed form) -> [value of each run]


@dataclass(frozen=True)
class Sweep:
    """A swept diagnostic of one (key, dataset, regime): the measured quantity y against the parameter x."""

    key: str
    dataset: str
    regime: str
    x: str
    y: str
    percent: bool  # y is an accuracy (shown in percent)
    tasks: dict  # task number (1-based) -> TaskSweep


def series(v) -> list | None:
    """A list of numbers (None allowed), or None when v is not such a list."""
    if isinstance(v, list) and v and all(x is None or is_number(x) for x in v):
        return [float(x) if x is not None else None for x in v]
    return None


def named_series(diagnostics: dict | None) -> list[tuple[str, list]]:
    """A record's numeric diagnostics as (name, series) pairs, in its key order; sweeps are left out."""
    return [(name, s) for _, name, s, _ in named_entries(diagnostics)]


def named_entries(diagnostics: dict | None) -> list[tuple[str, str, list, bool]]:
    """(top-level key, name, series, scalar) of a record's numeric diagnostics: scalar when the value was
    one number (not a list of one), so that a table can give it its own column beside per-task series."""
    return [(k, name, s, scalar) for k, v in (diagnostics or {}).items() for name, s, scalar in _flatten(k, v)]


def flatten(k: str, v) -> list[tuple[str, list]]:
    """Numeric diagnostics as named series: a number, a list of numbers, a list of such lists,
    a dict of those, or a per-task list of dicts (one series per key). Sweeps are charts instead."""
    return [(name, s) for name, s, _ in _flatten(k, v)]


def _flatten(k: str, v) -> list[tuple[str, list, bool]]:
    if is_number(v):
        return [(k, [float(v)], True)]
    s = series(v)
    if s is not None:
        return [(k, s, False)]
    if isinstance(v, list) and v and all(series(x) is not None for x in v):
        return [(f"{k}[{i}]", series(x), False) for i, x in enumerate(v)] if len(v) <= 4 else \
            [(f"{k} (mean of {len(v)})", elementwise_mean([series(x) for x in v]), False)]
    if isinstance(v, dict):
        return [entry for kk, vv in v.items() for entry in _flatten(f"{k}.{kk}", vv)]
    if is_sweep(v) or not _per_task_dicts(v):
        return []
    keys = sorted({kk for x in v if isinstance(x, dict) for kk, vv in x.items() if is_number(vv)})
    return [(f"{k}.{kk}", [float(x[kk]) if isinstance(x, dict) and is_number(x.get(kk)) else None for x in v], False)
            for kk in keys]


def diagnostic_means(records: list[RunRecord], regimes) -> list[DiagnosticMeans]:
    """Mean of each numeric diagnostic per (dataset, regime), elementwise over ok runs; names sorted."""
    return [m for table in diagnostic_tables(records, regimes) for m in table.series]


def diagnostic_tables(records: list[RunRecord], regimes) -> list[DiagnosticTable]:
    """One table per top-level diagnostic key (a dict's entries together): each series' mean per
    (dataset, regime), elementwise over ok runs; keys sorted, series sorted within a key."""
    acc: dict = {}
    for r in records:
        if r.ok:
            for top, name, s, scalar in named_entries(r.diagnostics):
                slot = acc.setdefault(top, {}).setdefault(name, {"scalar": scalar, "cells": {}})
                slot["scalar"] = slot["scalar"] and scalar  # a number in one run, a list in another: a series
                slot["cells"].setdefault((r.dataset, r.spec.regime), []).append(s)
    pos = {r: i for i, r in enumerate(regimes)}

    def means(name: str, cells: dict) -> DiagnosticMeans:
        ordered = sorted(cells.items(), key=lambda kv: (kv[0][0], pos.get(kv[0][1], 99)))
        return DiagnosticMeans(name, tuple(SeriesMean(ds, rg, len(lst), elementwise_mean(lst))
                                           for (ds, rg), lst in ordered))

    return [DiagnosticTable(top, tuple(means(n, acc[top][n]["cells"]) for n in sorted(acc[top])),
                            frozenset(n for n in acc[top] if acc[top][n]["scalar"])) for top in sorted(acc)]


def elementwise_mean(lists: list[list]) -> list:
    """Position by position, the mean of the lists' numbers (None where none has one)."""
    width = max(len(x) for x in lists)
    out = []
    for i in range(width):
        vals = [x[i] for x in lists if i < len(x) and x[i] is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def _per_task_dicts(v) -> bool:
    """A list of dicts (None allowed) with at least one dict: a per-task nested diagnostic."""
    return (isinstance(v, list) and any(isinstance(x, dict) for x in v)
            and all(x is None or isinstance(x, dict) for x in v))


def is_sweep(v) -> bool:
    """A per-task list of {..., "grid": [{param: x, quantity: y}, ...]} (BECAME's alpha_sweep)."""
    return _per_task_dicts(v) and all(isinstance(x.get("grid"), list) and x["grid"]
                                      and all(isinstance(p, dict) for p in x["grid"])
                                      for x in v if isinstance(x, dict))


def _sweep_keys(entry: dict) -> tuple[str, str] | None:
    """(swept parameter, measured quantity) of one sweep entry.

    The parameter is the grid key the entry also records as a scalar (BECAME: `alpha`, the chosen value).
    """
    keys = sorted({k for p in entry["grid"] for k, v in p.items() if is_number(v)})
    if len(keys) < 2:
        return None
    x = next((k for k in keys if is_number(entry.get(k))), "alpha" if "alpha" in keys else keys[0])
    return x, next(k for k in keys if k != x)


def sweeps(records: list[RunRecord], regimes) -> list[Sweep]:
    """Swept diagnostics of ok runs per (key, dataset, regime), sorted by key, dataset, regime order."""
    slots: dict = {}
    for r in records:
        if r.ok:
            for k, v in (r.diagnostics or {}).items():
                if is_sweep(v):
                    _add_sweep(slots, (k, r.dataset, r.spec.regime), v)
    pos = {r: i for i, r in enumerate(regimes)}
    return [Sweep(k, ds, rg, slot["x"], slot["y"], slot["percent"],
                  {t: TaskSweep(task["n"], task["pts"], task["marks"]) for t, task in slot["tasks"].items()})
            for (k, ds, rg), slot in sorted(slots.items(), key=lambda kv: (kv[0][0], kv[0][1], pos.get(kv[0][2], 99)))
            if slot["tasks"]]


def _add_sweep(slots: dict, key: tuple, v: list) -> None:
    """Accumulate one run's sweep: y values per (task, x), recorded scalars (chosen value, closed form)."""
    for t, entry in enumerate(v):
        keys = _sweep_keys(entry) if isinstance(entry, dict) else None
        if keys is None:
            continue
        xk, yk = keys
        slot = slots.setdefault(key, {"x": xk, "y": yk, "tasks": {}, "percent": yk.startswith("acc")})
        if (xk, yk) != (slot["x"], slot["y"]):
            continue  # another shape in the same key: not averaged with the first one
        task = slot["tasks"].setdefault(t + 1, {"pts": {}, "marks": {}, "n": 0})
        task["n"] += 1
        for p in entry["grid"]:
            if is_number(p.get(xk)) and is_number(p.get(yk)):
                task["pts"].setdefault(round(float(p[xk]), 9), []).append(float(p[yk]))
        for name, val in entry.items():
            if name != "grid" and is_number(val):
                task["marks"].setdefault(name, []).append(float(val))
