"""Paper figures from `analyse(records)`: per dataset, PDF/PNG files that are byte-identical for the same records.

Figures: mean rank per regime (rank shifts), Kendall tau between regimes, update norm vs
forgetting, accuracy curves over tasks and ACC /
forgetting with CIs; when runs carry continual-evaluation curves, the any-time curves around task
boundaries and the stability gap's depth per regime (none without curves). Regimes run from the
smallest trainable subspace to the largest; where a
figure plots against the regime, x is its trainable fraction on a log axis, regime names on top
(evenly spaced names instead when a fraction is unknown). Legends sit outside the axes.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and the same rasteriser everywhere; before any pyplot import

import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..analysis.frame import percent_scale, regime_order  # noqa: E402
from ..analysis.result import AnalysisResult  # noqa: E402
from ..config.files import AtomicWrites, ensure_dir, inside, safe_target  # noqa: E402
from ..config.metrics import ALL_METRICS, METRICS  # noqa: E402
from ..config.text import terminal_safe  # noqa: E402
from ..config.vocabulary import Status  # noqa: E402
from .charts import spread, tick_percent  # noqa: E402
from .formatting import NOT_AVAILABLE, num, p_eq, slug  # noqa: E402  (slug: file names safe for any label)

FORMATS = ("pdf", "png")
# Fixed settings on top of matplotlib's defaults (a user's matplotlibrc must not change the files).
RC = {"font.family": "DejaVu Sans", "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8,
      "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7, "figure.dpi": 100,
      "savefig.dpi": 200, "pdf.fonttype": 42, "svg.hashsalt": "cl-bench", "axes.grid": True,
      "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False, "lines.linewidth": 1.2,
      "lines.markersize": 4, "errorbar.capsize": 2, "image.cmap": "RdBu"}
# No timestamp or version in the files: the same tables give the same bytes.
METADATA = {"pdf": {"CreationDate": None}, "png": {"Software": None}}
MARKERS = "osD^vP*Xph"
PANEL_W, PANEL_H = 2.4, 2.2  # inches per panel
LEGEND = {"loc": "outside right upper", "frameon": False}


def write_figures(tables: AnalysisResult, out_dir, formats=FORMATS, log=None, root=None) -> list[Path]:
    """Write every figure of every dataset in each format to out_dir; returns the paths in write order.

    root: the folder the user named, out_dir inside it (default out_dir): no part below it may be a
    symbolic link. The files are renamed into place together once all are drawn: a failure (disk
    full) leaves the folder's files as they were.
    """
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"figure format {bad[0]!r} is not one of {', '.join(FORMATS)}")
    root = Path(out_dir if root is None else root)
    rel = inside(root, out_dir)
    ensure_dir(root, rel)
    written = []
    with matplotlib.rc_context(), AtomicWrites() as staged:
        matplotlib.rcdefaults()  # restored on leaving the context
        matplotlib.rcParams.update(RC)
        for ds in sorted(tables.methods["dataset"].unique()):
            for kind, draw in {**FIGURES, **ANYTIME_FIGURES}.items():
                fig = draw(tables, ds)
                if fig is not None:
                    written += _save(fig, rel / f"{slug(ds)}-{kind}", formats,
                                     lambda path, data: staged.write(safe_target(root, path), data))
    for path in written if log else ():
        log(path)
    return written


def _save(fig: Figure, stem, formats, write) -> list[Path]:
    """Each format's bytes of fig to `write(stem.<format>, bytes)`; returns the paths it gives."""
    paths = []
    for fmt in formats:
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, metadata=METADATA[fmt])
        paths.append(write(stem.with_name(f"{stem.name}.{fmt}"), buffer.getvalue()))
    return paths


def text(label) -> str:
    """A label as literal matplotlib text: one line, '$' not read as mathtext."""
    return terminal_safe(label).replace("$", r"\$")


def _figure(n_panels: int = 1, rows: int = 1, sharex=False, sharey=False, extra_w: float = 1.3):
    """A constrained-layout figure with a grid of panels and room on the right for the legend."""
    cols = max(1, math.ceil(n_panels / rows))
    fig = Figure(figsize=(PANEL_W * cols + extra_w, PANEL_H * rows), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: nothing global keeps the figure alive, and it can be drawn
    axes = fig.subplots(rows, cols, sharex=sharex, sharey=sharey, squeeze=False)
    return fig, list(axes.ravel())


def _style(methods) -> dict:
    """Method -> (colour, marker), by position in the sorted method list (stable across figures)."""
    colours = matplotlib.colormaps["tab10" if len(methods) <= 10 else "tab20"].colors
    return {m: (colours[i % len(colours)], MARKERS[i % len(MARKERS)]) for i, m in enumerate(sorted(methods))}


def _regimes(tables: AnalysisResult, present) -> list:
    present = set(present)
    return [r for r in regime_order(tables.runs) if r in present]


def _methods_of(tables: AnalysisResult, ds) -> pd.DataFrame:
    m = tables.methods
    return m[m["dataset"] == ds]


def regime_x(tables: AnalysisResult, ds, regimes) -> tuple[dict, bool]:
    """x per regime: its trainable fraction on the dataset (True) when every one is known, else 0, 1, ... (False)."""
    rt = tables.regimes
    sub = rt[rt["dataset"] == ds]
    fr = dict(zip(sub["regime"], sub["fraction"].astype(float)))
    if regimes and all(math.isfinite(fr.get(r, math.nan)) and fr[r] > 0 for r in regimes):
        return {r: fr[r] for r in regimes}, True
    return {r: float(i) for i, r in enumerate(regimes)}, False


def _regime_layout(tables: AnalysisResult, ds, sub: pd.DataFrame) -> tuple:
    """What a per-regime chart of `sub`'s methods places: its regimes, their x positions (and whether the
    axis is logarithmic), its methods in name order and their styles."""
    regimes = _regimes(tables, sub["regime"])
    pos, log = regime_x(tables, ds, regimes)
    methods = sorted(sub["method"].unique())
    return regimes, pos, log, methods, _style(methods)


def _regime_axis(ax, xs: dict, log: bool, names_on=None) -> None:
    """The regime axis: log trainable fraction (percent ticks) with the regime names over names_on
    (default ax), or the names as ticks when the fractions are unknown."""
    regimes = list(xs)
    if not log:
        ax.set_xticks(range(len(regimes)), [text(r) for r in regimes], rotation=30, ha="right")
        ax.set_xlim(-0.5, len(regimes) - 0.5)
        ax.set_xlabel("regime (smallest trainable subspace first)")
        return
    lo, hi = min(xs.values()), max(xs.values())
    pad = max((hi / lo) ** 0.08, 1.3)  # room for the dodged whiskers at both ends
    ax.set_xscale("log")
    ax.set_xlim(lo / pad, hi * pad)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: tick_percent(v)))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if hi / lo < 30:  # under ~1.5 decades the powers of ten alone leave the axis unlabelled
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.set_xlabel("trainable fraction (log scale)")
    _regime_names(names_on or ax, xs)


def _regime_names(ax, xs: dict) -> None:
    """Regime names above the axes at their fraction, rotated and spread apart, a leader line to each;
    a faint vertical line marks every regime."""
    lo, hi = (math.log10(v) for v in ax.get_xlim())
    at = {r: (math.log10(x) - lo) / (hi - lo) for r, x in xs.items()}
    order = sorted(xs, key=lambda r: (at[r], r))
    width = ax.figure.get_figwidth() * 0.6  # inches of the axes, roughly: labels need ~0.12 in each
    pos = spread([at[r] for r in order], 0.12 / width, 0.0, 1.0)
    for r, p in zip(order, pos):
        ax.axvline(xs[r], color="0.88", linewidth=0.6, zorder=0)
        ax.plot([at[r], p], [1.0, 1.04], transform=ax.transAxes, color="0.6", linewidth=0.5, clip_on=False)
        ax.text(p, 1.05, text(r), transform=ax.transAxes, rotation=45, rotation_mode="anchor", ha="left",
                va="bottom", fontsize=6.5, gid="regime-name")


def _dodge(i: int, k: int, width: float = 0.5) -> float:
    """Horizontal offset of method i of k, so that whiskers at one regime do not overlap."""
    return 0.0 if k == 1 else (i - (k - 1) / 2) * width / k


def _dodged(x: np.ndarray, xs: dict, log: bool, i: int, k: int, width: float) -> np.ndarray:
    """x moved by method i's dodge: a shift on an index axis; on a log axis a factor, in units of
    the mean step between regimes (decades), at most a tenth of a decade."""
    if not log:
        return x + _dodge(i, k, width)
    v = list(xs.values())
    step = math.log10(max(v) / min(v)) / max(len(v) - 1, 1) if len(v) > 1 else 1.0
    return x * 10 ** (_dodge(i, k, width) * min(step, 0.4))


# ------------------------------------------------------------------------- (a) rank shifts

def rank_shift(tables: AnalysisResult, ds) -> Figure | None:
    """Mean rank (1 = best) per regime, one line per method, with bootstrap CI whiskers."""
    sub = _methods_of(tables, ds).dropna(subset=["mean_rank"])
    if sub.empty:
        return None
    regimes, pos, log, methods, style = _regime_layout(tables, ds, sub)
    fig, (ax,) = _figure()
    for i, m in enumerate(methods):
        d = sub[sub["method"] == m].assign(x=lambda f: f["regime"].map(pos)).sort_values("x")
        x = _dodged(d["x"].to_numpy(), pos, log, i, len(methods), 0.3)
        err = np.vstack([d["mean_rank"] - d["rank_lo"], d["rank_hi"] - d["mean_rank"]]).clip(min=0)
        colour, marker = style[m]
        ax.errorbar(x, d["mean_rank"], yerr=err, color=colour, marker=marker, label=text(m))
    ax.set_ylim(len(methods) + 0.5, 0.5)  # rank 1 on top
    ax.set_yticks(range(1, len(methods) + 1))
    ax.set_ylabel("mean rank (1 = best)")
    _regime_axis(ax, pos, log)
    fig.suptitle(f"{text(ds)}: mean rank per regime")
    fig.legend(title="method", **LEGEND)
    return fig


# ------------------------------------------------------------------------- (b) Kendall tau

def tau_heatmap(tables: AnalysisResult, ds) -> Figure | None:
    """Kendall tau_b between the method rankings of every pair of regimes; tau, p and n in each cell."""
    sub = tables.tau[tables.tau["dataset"] == ds]
    regimes = _regimes(tables, sub["regime_a"]) if len(sub) else []
    if len(regimes) < 2:
        return None
    pos = {r: i for i, r in enumerate(regimes)}
    n = len(regimes)
    grid = np.full((n, n), np.nan)
    fig, (ax,) = _figure(extra_w=0.8)
    fig.set_size_inches(max(3.2, 0.9 * n + 1.8), max(2.6, 0.8 * n + 1.2))
    for r in sub.itertuples(index=False):
        if r.regime_a in pos and r.regime_b in pos:
            i, j = pos[r.regime_a], pos[r.regime_b]
            grid[i, j] = r.tau
            p = "" if i == j else f"\np {p_eq(r.p)}"
            label = NOT_AVAILABLE if math.isnan(r.tau) else f"τ={num(r.tau, 2)}"
            ax.text(j, i, f"{label}{p}\nn={int(r.n_methods)}", ha="center", va="center", fontsize=6,
                    color="white" if abs(np.nan_to_num(r.tau)) > 0.6 else "black")
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=-1, vmax=1, cmap="RdBu")
    ax.set_xticks(range(n), [text(r) for r in regimes], rotation=30, ha="right")
    ax.set_yticks(range(n), [text(r) for r in regimes])
    ax.set_xlabel("regime")
    ax.set_ylabel("regime")
    ax.grid(False)
    fig.colorbar(image, ax=ax, label="Kendall τ_b (n = methods ranked)")
    fig.suptitle(f"{text(ds)}: rank agreement between regimes")
    return fig


# ------------------------------------------------------------------------- (c) norm vs forgetting

def norm_forgetting(tables: AnalysisResult, ds) -> Figure | None:
    """Per regime, one point per ok run: mean update norm against forgetting, coloured by method."""
    runs = tables.runs
    sub = runs[(runs["dataset"] == ds) & (runs["status"] == Status.OK)]
    sub = sub.dropna(subset=["mean_update_norm", "forgetting"])
    if sub.empty:
        return None
    scale = percent_scale(runs)
    regimes = _regimes(tables, sub["regime"])
    style = _style(sub["method"].unique())
    fig, axes = _figure(len(regimes), sharey=True)
    for ax, rg in zip(axes, regimes):
        d = sub[sub["regime"] == rg]
        for m in sorted(d["method"].unique()):
            pts = d[d["method"] == m]
            colour, marker = style[m]
            ax.scatter(pts["mean_update_norm"], pts["forgetting"] * scale, color=colour, marker=marker, s=14)
        ax.set_title(_corr_title(tables, ds, rg))
        ax.set_xlabel("mean update norm per task")
    axes[0].set_ylabel(_axis_label("forgetting"))
    fig.suptitle(f"{text(ds)}: update norm vs forgetting (one point per run)")
    _method_legend(fig, style)
    return fig


def _corr_title(tables: AnalysisResult, ds, rg) -> str:
    """The regime's name with its Spearman rho from tables.norm_forgetting, when there is one."""
    nf = tables.norm_forgetting
    row = nf[(nf["dataset"] == ds) & (nf["regime"] == rg)]
    rho = float(row["rho"].iloc[0]) if len(row) else math.nan
    return text(rg) + ("" if math.isnan(rho) else f" (ρ={num(rho, 2)})")


def _method_legend(fig: Figure, style: dict) -> None:
    """One legend entry per method (not per panel), outside the panels."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, marker=mk, linestyle="none", label=text(m)) for m, (c, mk) in style.items()]
    fig.legend(handles=handles, title="method", **LEGEND)


# ------------------------------------------------------------------------- (d) accuracy curves

def curves(tables: AnalysisResult, ds) -> Figure | None:
    """Mean accuracy after each task with CI bands, one line per method, one panel per regime."""
    sub = tables.curves[tables.curves["dataset"] == ds].dropna(subset=["acc"])
    if sub.empty:
        return None
    scale = percent_scale(tables.runs)
    regimes = _regimes(tables, sub["regime"])
    style = _style(sub["method"].unique())
    fig, axes = _figure(len(regimes), sharey=True)
    for ax, rg in zip(axes, regimes):
        d = sub[sub["regime"] == rg]
        for m in sorted(d["method"].unique()):
            c = d[d["method"] == m].sort_values("task")
            colour, marker = style[m]
            ax.plot(c["task"], c["acc"] * scale, color=colour, marker=marker)
            ax.fill_between(c["task"], c["acc_lo"] * scale, c["acc_hi"] * scale, color=colour, alpha=0.15,
                            linewidth=0)
        ax.set_title(text(rg))
        ax.set_xlabel("after training task")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_ylabel("mean accuracy on tasks 1..t (%)")
    fig.suptitle(f"{text(ds)}: accuracy on the tasks seen so far (mean, 95% CI band)")
    _method_legend(fig, style)
    return fig


# ------------------------------------------------------------------------- (e) ACC / forgetting

def acc_forgetting(tables: AnalysisResult, ds) -> Figure | None:
    """ACC (top) and forgetting (bottom) per regime and method: means with 95% CI whiskers."""
    sub = _methods_of(tables, ds)
    if sub["acc"].notna().sum() == 0:
        return None
    scale = percent_scale(tables.runs)
    regimes, pos, log, methods, style = _regime_layout(tables, ds, sub)
    fig, axes = _figure(2, rows=2, sharex=True)
    fig.set_size_inches(max(3.5, 0.9 * len(regimes) * max(1, len(methods) / 4) + 1.8), 2 * PANEL_H)
    for ax, metric in zip(axes, ("acc", "forgetting")):
        for i, m in enumerate(methods):
            d = sub[sub["method"] == m].dropna(subset=[metric]).assign(x=lambda f: f["regime"].map(pos))
            err = np.vstack([d[metric] - d[f"{metric}_lo"], d[f"{metric}_hi"] - d[metric]]).clip(min=0) * scale
            colour, marker = style[m]
            ax.errorbar(_dodged(d["x"].to_numpy(), pos, log, i, len(methods), 0.5), d[metric] * scale, yerr=err,
                        color=colour, marker=marker, linestyle="none")
        ax.set_ylabel(f"{_axis_label(metric)}, 95% CI")
    _regime_axis(axes[1], pos, log, names_on=axes[0])
    axes[0].tick_params(labelbottom=False)
    fig.suptitle(f"{text(ds)}: {METRICS['acc'].label} and {METRICS['forgetting'].label}")
    _method_legend(fig, style)
    return fig


def _axis_label(metric: str) -> str:
    """A metric's axis label from the metric table: its label and unit, e.g. "ACC (%)"."""
    m = ALL_METRICS[metric]
    return f"{m.label} ({'% points' if metric == 'gap_depth' else m.unit})"


# ------------------------------------------------------------------------- (f) any-time curves

def _panels(sub: pd.DataFrame, tables: AnalysisResult) -> list[tuple]:
    """(scenario, regime) panels in regime order; the scenario only named when there are several."""
    keys = set(zip(sub["scenario"], sub["regime"])) if "scenario" in sub else {(None, r) for r in sub["regime"]}
    scenarios = sorted({sc for sc, _ in keys}, key=str)
    return [(sc, rg) for sc in scenarios for rg in _regimes(tables, sub["regime"]) if (sc, rg) in keys]


def anytime_curves(tables: AnalysisResult, ds) -> Figure | None:
    """Mean accuracy on the earlier tasks while each task trains (continual evaluation), with 95% CI
    bands, one line per method, one panel per regime; dotted lines at task boundaries. Each task's
    segment starts at its pre-task value (the previous task's end point, on the tasks seen then), so a
    dip right after a boundary is the stability gap."""
    sub = tables.anytime_curves[tables.anytime_curves["dataset"] == ds]
    if sub.empty or sub["old_acc"].notna().sum() == 0:
        return None
    scale = percent_scale(tables.runs)
    panels = _panels(sub, tables)
    many = len({sc for sc, _ in panels}) > 1
    style = _style(sub["method"].unique())
    fig, axes = _figure(len(panels), rows=math.ceil(len(panels) / 4), sharey=True)
    n_tasks = int(sub["task"].max())
    for ax, (sc, rg) in zip(axes, panels):
        d = sub[(sub["regime"] == rg) & ((sub["scenario"] == sc) if "scenario" in sub else True)]
        for m in sorted(d["method"].unique()):
            c = d[d["method"] == m].sort_values(["task", "point"])
            colour, _ = style[m]
            for t in range(2, n_tasks + 1):
                seg = _segment(c, t)
                if seg is None:
                    continue
                x, y, lo, hi = seg
                ax.plot(x, y * scale, color=colour, linewidth=1.0)
                ax.fill_between(x, lo * scale, hi * scale, color=colour, alpha=0.15, linewidth=0)
        for b in range(1, n_tasks):
            ax.axvline(b, color="0.55", linestyle=":", linewidth=0.7, zorder=0)
        ax.set_xlim(0.9, n_tasks)
        ax.set_xticks(range(1, n_tasks + 1))
        ax.set_title(text(rg) + (f" ({text(sc)})" if many else ""))
        ax.set_xlabel("tasks trained (boundary = integer)")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].set_ylabel("mean accuracy on earlier tasks (%)")
    fig.suptitle(f"{text(ds)}: accuracy on earlier tasks during training (mean, 95% CI band)")
    from matplotlib.lines import Line2D

    fig.legend(handles=[Line2D([], [], color=c, label=text(m)) for m, (c, _) in style.items()], title="method",
               **LEGEND)
    return fig


def _segment(c: pd.DataFrame, t: int):
    """x, mean, lo, hi of task t's old-task accuracy, preceded by its pre-task value (seen accuracy at
    task t-1's end point, which is the accuracy on the same tasks); None when task t has no point."""
    cur = c[(c["task"] == t)].dropna(subset=["old_acc"])
    if cur.empty:
        return None
    pre = c[(c["task"] == t - 1) & c["end"].astype(bool)].dropna(subset=["seen_acc"])
    x, y = cur["x"].to_numpy(float), cur["old_acc"].to_numpy(float)
    lo, hi = cur["old_acc_lo"].to_numpy(float), cur["old_acc_hi"].to_numpy(float)
    if len(pre):
        p = pre.iloc[-1]
        x, y = np.r_[p["x"], x], np.r_[p["seen_acc"], y]
        lo, hi = np.r_[p["seen_acc_lo"], lo], np.r_[p["seen_acc_hi"], hi]
    return x, y, lo, hi


# ------------------------------------------------------------------------- (g) gap depth per regime

def gap_depth(tables: AnalysisResult, ds) -> Figure | None:
    """Mean stability-gap depth per regime and method (runs with a curve), 95% CI whiskers, against the
    trainable fraction; the trend of each method (tables.gap_trend) in the legend."""
    sub = _methods_of(tables, ds).dropna(subset=["gap_depth"])
    if sub.empty:
        return None
    scale = percent_scale(tables.runs)
    regimes, pos, log, methods, style = _regime_layout(tables, ds, sub)
    trend = tables.gap_trend[tables.gap_trend["dataset"] == ds]
    trend = dict(zip(trend["method"], trend["trend"]))
    fig, (ax,) = _figure(extra_w=1.8)
    fig.set_size_inches(min(7.5, max(4.5, 0.9 * len(regimes) * max(1, len(methods) / 4) + 2.2)), PANEL_H + 0.6)
    for i, m in enumerate(methods):
        d = sub[sub["method"] == m].assign(x=lambda f: f["regime"].map(pos)).sort_values("x")
        err = np.vstack([d["gap_depth"] - d["gap_depth_lo"], d["gap_depth_hi"] - d["gap_depth"]]).clip(min=0) * scale
        colour, marker = style[m]
        label = text(m) + (f" ({trend[m]})" if m in trend else "")
        ax.errorbar(_dodged(d["x"].to_numpy(), pos, log, i, len(methods), 0.25), d["gap_depth"] * scale, yerr=err,
                    color=colour, marker=marker, label=label)
    ax.axhline(0, color="0.5", linewidth=0.6, zorder=0)
    ax.set_ylabel(f"{_axis_label('gap_depth')}, 95% CI")
    _regime_axis(ax, pos, log)
    fig.suptitle(f"{text(ds)}: stability-gap depth per regime")
    fig.legend(title="method (trend)", **LEGEND)
    return fig


FIGURES = {"rank-shift": rank_shift, "tau": tau_heatmap, "norm-forgetting": norm_forgetting,
           "curves": curves, "acc-forgetting": acc_forgetting}
# drawn only when runs carry continual-evaluation curves (each returns None otherwise)
ANYTIME_FIGURES = {"anytime-curves": anytime_curves, "gap-depth": gap_depth}
