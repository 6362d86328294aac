"""Paper tables from `analyse(records)`: per dataset, method x regime cells "mean ± CI half-width".

Pure functions (tables in, text out): `report_markdown` for a GitHub table, `report_latex` for
a booktabs table. Each dataset gets the chosen metric's table, then forgetting's, and when runs carry
a continual-evaluation curve, min-ACC's and the stability gap's depth (ANYTIME_SHOWN). Any metric of
either metric table (config/metrics.py METRICS, ANYTIME) can lead. Separate tables,
not two lines per cell: a Markdown cell holds one line, each table has its own best cell per
column (the metric table says which way is better; formatting.best_as_printed decides), and
either table can be pasted alone.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import pandas as pd

from ..analysis.frame import FLAG, percent_scale, regime_order
from ..analysis.result import AnalysisResult, AnalysisSettings
from ..analysis.tables import REFERENCE_METHOD
from ..config.errors import UsageError
from ..config.metrics import ALL_METRICS, ANYTIME
from ..config.text import terminal_safe
from .formatting import (
    MISSING,
    NOT_MEASURED,
    TEX_MISSING,
    best_as_printed,
    half_width,
    mean_ci,
    rope_text,
    slug,
    times_text,
)

CREDIBLE_METRIC = "acc"  # the Bayesian comparison (AnalysisResult.bayes) is over ACC
MD_CREDIBLE, TEX_CREDIBLE = "‡", r"\ddag"
TEX_FLAG = r"\dag"
ANYTIME_SHOWN = ("min_acc", "gap_depth")  # the any-time tables a report adds when runs have curves


@dataclass(frozen=True)
class Cell:
    """One table cell: mean and CI half-width (percent), flagged runs, best and credibly-best marks."""

    mean: float
    half: float | None  # None when a CI bound is missing
    n_flagged: int = 0
    best: bool = False
    credible: bool = False


@dataclass(frozen=True)
class Grid:
    """One metric's method x regime table of one dataset, with what its caption says."""

    dataset: str
    metric: str
    regimes: tuple
    methods: tuple
    cells: dict  # (method, regime) -> Cell; a missing key is a missing cell (never imputed)
    n_orders: int
    n_seeds: int
    ok_range: tuple  # (fewest, most) ok runs in a cell
    credible_note: str  # how credibility was decided (the Bayesian comparison's settings)


def grids(tables: AnalysisResult, metric: str = "acc") -> list[list[Grid]]:
    """Per dataset (sorted), the metric's grid, then forgetting's, then (when a run has a continual-
    evaluation curve) min-ACC's and gap depth's; each once. An any-time metric needs curves."""
    if metric not in ALL_METRICS:
        raise ValueError(f"metric {metric!r} is not one of {', '.join(ALL_METRICS)}")
    curves = has_curves(tables)
    if metric in ANYTIME and not curves:
        raise UsageError(f"--metric {metric}: no run has a continual-evaluation curve (the protocol's "
                         f"evaluation.every); choose one of the end-of-task metrics")
    regimes = regime_order(tables.runs)
    scale = percent_scale(tables.runs)
    shown = tuple(dict.fromkeys((metric, "forgetting", *(ANYTIME_SHOWN if curves else ()))))
    note = _credible_note(tables.settings)
    return [[_grid(sub, tables.runs, ds, m, regimes, scale if ALL_METRICS[m].unit == "%" else 1.0, tables.bayes,
                   note) for m in shown]
            for ds, sub in tables.methods.groupby("dataset", sort=True)]


def has_curves(tables: AnalysisResult) -> bool:
    """True when some run carries a continual-evaluation curve (frame column has_curve)."""
    runs = tables.runs
    return bool("has_curve" in runs and runs["has_curve"].astype(bool).any())


def _grid(sub: pd.DataFrame, runs: pd.DataFrame, ds, metric: str, order, scale: float, bayes: pd.DataFrame,
          note: str) -> Grid:
    present = set(sub["regime"])
    regimes = tuple(r for r in order if r in present)
    cells = {}
    for r in sub.itertuples(index=False):
        mean = getattr(r, metric)
        if not math.isnan(mean):
            half = half_width(getattr(r, f"{metric}_lo"), getattr(r, f"{metric}_hi"), scale)
            cells[(r.method, r.regime)] = Cell(mean * scale, half, int(r.n_flagged))
    cells = _mark_best(cells, regimes, ALL_METRICS[metric].higher_is_better)
    if metric == CREDIBLE_METRIC:
        cells = _mark_credible(cells, regimes, bayes[bayes["dataset"] == ds])
    ds_runs = runs[runs["dataset"] == ds]
    ok = sub["n_ok"]
    return Grid(dataset=ds, metric=metric, regimes=regimes, methods=tuple(dict.fromkeys(sub["method"])),
                cells=cells, n_orders=int(ds_runs["order"].nunique()), n_seeds=int(ds_runs["seed"].nunique()),
                ok_range=(int(ok.min()), int(ok.max())), credible_note=note)


def _column(cells: dict, regime, higher_is_better: bool) -> list:
    """The column's (method, cell) pairs, best mean first (name order breaks ties)."""
    col = sorted(((m, c) for (m, r), c in cells.items() if r == regime), key=lambda mc: mc[0])
    return sorted(col, key=lambda mc: -mc[1].mean if higher_is_better else mc[1].mean)


def _mark_best(cells: dict, regimes, higher_is_better: bool) -> dict:
    """Bold every cell of its column's best printed mean (ties all bold)."""
    out = dict(cells)
    for rg in regimes:
        column = {m: c.mean for (m, r), c in cells.items() if r == rg}
        for m in best_as_printed(column, higher_is_better):
            out[(m, rg)] = replace(cells[(m, rg)], best=True)
    return out


def _mark_credible(cells: dict, regimes, bayes: pd.DataFrame) -> dict:
    """Mark a column's best method where the Bayesian test decides for it against the runner-up."""
    out = dict(cells)
    for rg in regimes:
        col = _column(cells, rg, ALL_METRICS[CREDIBLE_METRIC].higher_is_better)
        if len(col) < 2:
            continue
        (best, cell), (runner, _) = col[0], col[1]
        if _decided_for(bayes[bayes["regime"] == rg], best, runner):
            out[(best, rg)] = replace(cell, credible=True)
    return out


def _decided_for(rows: pd.DataFrame, best, runner) -> bool:
    """True when the (best, runner-up) comparison's decision names `best`, in either column order."""
    for r in rows.itertuples(index=False):
        pair = {r.method_1, r.method_2}
        if pair == {best, runner}:
            winner = {"method_1": r.method_1, "method_2": r.method_2}.get(r.decision)
            return winner == best
    return False


def _credible_note(settings: AnalysisSettings) -> str:
    """'Bayesian signed-rank test ..., ROPE r ACC points, P >= level', with the analysis' settings."""
    return (f"Bayesian signed-rank test over paired task orders, {rope_text(settings.rope_points)}, "
            f"P ≥ {settings.credible:g}")


def _caption(g: Grid) -> str:
    """What the numbers are: the metric, over how many orders, what ± means, what bold means."""
    runs = f"{g.n_orders} task orders" + (f" × {g.n_seeds} seeds" if g.n_seeds > 1 else "")
    lo, hi = g.ok_range
    ok = f"; ok runs per cell: {lo}–{hi}" if lo != hi else ""
    metric = ALL_METRICS[g.metric]
    best = "highest" if metric.higher_is_better else "lowest"
    unit = "% points" if g.metric == "gap_depth" else metric.unit
    # no comma before the first ", ": the Markdown caption bolds what comes before it
    during = " (any-time; from the runs' continual-evaluation curves)" if g.metric in ANYTIME else ""
    return (f"{metric.label} ({unit}){during}, mean over {runs}{ok}; ± is half the width of the 95% percentile "
            f"bootstrap CI of the mean. Bold: the {best} mean of each regime (as printed).")


def _legend(g: Grid, ranked_flagged: bool) -> list[tuple[str, str]]:
    """(mark kind, sentence) for the marks the table carries: flag only if a cell has one."""
    out = []
    if any(c.n_flagged for c in g.cells.values()):
        policy = "ranked anyway (--include-flagged)" if ranked_flagged else "left out of rank statistics"
        out.append(("flag", f"N runs of the cell have learning-check warnings; included in these means, {policy}."))
    if g.metric == CREDIBLE_METRIC:
        out.append(("credible", f"credibly better than the regime's runner-up ({g.credible_note})."))
    return out


def _flag_policy(tables: AnalysisResult) -> bool:
    """True when flagged runs entered the rank statistics (analyse(..., include_flagged=True))."""
    runs = tables.runs
    flagged = runs[runs["flagged"].astype(bool)]
    return bool(flagged["ranked"].any()) if len(flagged) else False


# ---------------------------------------------------------------------------------- Markdown

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&$!#])")


def md_escape(text) -> str:
    """A label as literal Markdown text in a GitHub table (one line, no markup, no raw HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", terminal_safe(text))


def report_markdown(tables: AnalysisResult, metric: str = "acc") -> str:
    """Per dataset: the metric's and forgetting's method x regime tables as GitHub Markdown."""
    ranked_flagged = _flag_policy(tables)
    parts = ["# cl-bench report"]
    for dataset_grids in grids(tables, metric):
        parts.append(f"## Dataset: {md_escape(dataset_grids[0].dataset)}")
        parts += [_md_table(g, ranked_flagged) for g in dataset_grids]
        compute = compute_grid(tables, dataset_grids[0].dataset)
        if compute:
            parts.append(_md_compute(*compute))
    return "\n\n".join(parts) + "\n"


def compute_grid(tables: AnalysisResult, dataset) -> tuple | None:
    """(regimes, methods, {(method, regime): FLOPs relative to REFERENCE_METHOD}) of a dataset's cells, None
    when no run of it was measured (records from before compute accounting: the report is as it was)."""
    sub = tables.methods[tables.methods["dataset"] == dataset]
    if "flops" not in sub or not sub["flops"].notna().any():
        return None
    regimes = [r for r in regime_order(tables.runs) if r in set(sub["regime"])]
    cells = {(r.method, r.regime): r.relative_flops for r in sub.itertuples()}
    return regimes, sorted(set(sub["method"])), cells


def _compute_caption() -> str:
    return (f"Training compute, FLOPs relative to {REFERENCE_METHOD} in the same regime (forward + backward "
            f"sample-passes counted at the model; {NOT_MEASURED}: no measured record or no {REFERENCE_METHOD})")


def _md_compute(regimes, methods, cells) -> str:
    lines = [f"**{_compute_caption()}**", "", _md_row(["method", *(md_escape(r) for r in regimes)]),
             _md_row(["---", *("---:" for _ in regimes)])]
    lines += [_md_row([md_escape(m), *(_times(cells.get((m, r))) for r in regimes)]) for m in methods]
    return "\n".join(lines)


def _times(x) -> str:
    return MISSING if x is None else times_text(x)


def _md_table(g: Grid, ranked_flagged: bool) -> str:
    header = ["method", *(md_escape(r) for r in g.regimes)]
    title, rest = _caption(g).split(", ", 1)
    lines = [f"**{title}**, {rest}", "",
             _md_row(header), _md_row(["---", *("---:" for _ in g.regimes)])]
    lines += [_md_row([md_escape(m), *(_md_cell(g.cells.get((m, r))) for r in g.regimes)]) for m in g.methods]
    marks = {"flag": f"{FLAG}N", "credible": MD_CREDIBLE}
    legend = [f"{marks[kind]}: {md_escape(text)}" for kind, text in _legend(g, ranked_flagged)]
    return "\n".join(lines + ([""] + legend if legend else []))


def _md_row(items) -> str:
    return "| " + " | ".join(items) + " |"


def _md_cell(cell: Cell | None) -> str:
    if cell is None:
        return MISSING
    number = mean_ci(cell.mean, cell.half)
    text = f"**{number}**" if cell.best else number
    text += MD_CREDIBLE if cell.credible else ""
    return text + (f" {FLAG}{cell.n_flagged}" if cell.n_flagged else "")


# ---------------------------------------------------------------------------------- LaTeX

_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
        "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}


def tex_escape(text) -> str:
    """A label as literal LaTeX text (every special character escaped, one line)."""
    out = "".join(_TEX.get(ch, ch) for ch in terminal_safe(text))
    return re.sub(r"-(?=-)", "-{}", out)  # "--" would print as a dash


def _tex_prose(text: str) -> str:
    """Our own caption text: escaped, with its symbols as LaTeX commands (no unicode needed)."""
    return (tex_escape(text).replace("±", r"$\pm$").replace("×", r"$\times$").replace("–", "--")
            .replace("≥", r"$\geq$"))


def report_latex(tables: AnalysisResult, metric: str = "acc") -> str:
    """Per dataset: the metric's and forgetting's method x regime tables as booktabs LaTeX."""
    ranked_flagged = _flag_policy(tables)
    parts = ["% cl-bench report; needs \\usepackage{booktabs}"]
    for dataset_grids in grids(tables, metric):
        parts += [_tex_table(g, ranked_flagged) for g in dataset_grids]
        compute = compute_grid(tables, dataset_grids[0].dataset)
        if compute:
            parts.append(_tex_compute(dataset_grids[0].dataset, *compute))
    return "\n\n".join(parts) + "\n"


def _tex_compute(dataset, regimes, methods, cells) -> str:
    rows = [" & ".join(["Method", *(tex_escape(r) for r in regimes)]) + r" \\"]
    body = [" & ".join([tex_escape(m), *(TEX_MISSING if cells.get((m, r)) is None else _tex_prose(times_text(
        cells[(m, r)])) for r in regimes)]) + r" \\" for m in methods]
    return "\n".join([r"\begin{table}[t]", r"\centering",
                      f"\\caption{{Dataset {tex_escape(dataset)}: {_tex_prose(_compute_caption())}}}",
                      f"\\label{{tab:{slug(dataset)}-compute}}",
                      f"\\begin{{tabular}}{{l{'r' * len(regimes)}}}", r"\toprule", *rows, r"\midrule",
                      *body, r"\bottomrule", r"\end{tabular}", r"\end{table}"])


def _tex_table(g: Grid, ranked_flagged: bool) -> str:
    marks = {"flag": f"\\textsuperscript{{{TEX_FLAG}{{}}N}}", "credible": f"\\textsuperscript{{{TEX_CREDIBLE}}}"}
    legend = "".join(f" {marks[kind]}: {_tex_prose(text)}" for kind, text in _legend(g, ranked_flagged))
    caption = f"Dataset {tex_escape(g.dataset)}: {_tex_prose(_caption(g))}{legend}"
    rows = [" & ".join(["Method", *(tex_escape(r) for r in g.regimes)]) + r" \\"]
    body = [" & ".join([tex_escape(m), *(_tex_cell(g.cells.get((m, r))) for r in g.regimes)]) + r" \\"
            for m in g.methods]
    return "\n".join([r"\begin{table}[t]", r"\centering", f"\\caption{{{caption}}}",
                      f"\\label{{tab:{slug(g.dataset)}-{g.metric}}}",
                      f"\\begin{{tabular}}{{l{'r' * len(g.regimes)}}}", r"\toprule", *rows, r"\midrule",
                      *body, r"\bottomrule", r"\end{tabular}", r"\end{table}"])


def _tex_cell(cell: Cell | None) -> str:
    if cell is None:
        return TEX_MISSING
    text = mean_ci(cell.mean, cell.half, tex=True)
    text = f"\\textbf{{{text}}}" if cell.best else text
    marks = (TEX_CREDIBLE if cell.credible else "") + (f"{TEX_FLAG}{cell.n_flagged}" if cell.n_flagged else "")
    return text + (f"\\textsuperscript{{{marks}}}" if marks else "")
