"""Chart geometry for the leaderboard's inline SVG: analysis frames in, plain numbers out.

The templates (leaderboard/templates/charts.html) only draw what these functions return. Charts
whose layout depends on their labels (margins sized to the longest name, end labels spread apart,
panels sharing one axis) are laid out here in pixels, so the layout can be tested without a browser.
"""
from __future__ import annotations

import math

import pandas as pd

from ..analysis.diagnostics import Sweep
from ..analysis.frame import family_of
from ..config.numbers import is_number
from ..config.vocabulary import Status
from .formatting import fraction_text, num

# One colour per regime, light (small trainable subspace) to dark (large): size reads as intensity.
REGIME_COLOURS = ("#f4a259", "#e76f51", "#b5446e", "#6a4c93", "#1d3557", "#0b132b")
METHOD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# Light to dark: later tasks darker, as the regimes.
TASK_COLOURS = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b", "#041a3a")


def clean(v):
    """JSON-safe scalar (NaN -> None, numpy -> Python)."""
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def regime_colours(regimes) -> dict:
    """Colour per regime in regime order: REGIME_COLOURS in turn, interpolated along them past six."""
    n = len(regimes)
    if n <= len(REGIME_COLOURS):
        return dict(zip(regimes, REGIME_COLOURS))
    rgb = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in REGIME_COLOURS]
    out = {}
    for i, r in enumerate(regimes):
        t = i / (n - 1) * (len(rgb) - 1)
        k = min(int(t), len(rgb) - 2)
        a, b, f = rgb[k], rgb[k + 1], t - k
        out[r] = "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))
    return out


def tick_percent(v: float) -> str:
    """An axis tick of a fraction as a short percent: 0.001 -> 0.1%, 1 -> 100%."""
    return f"{v * 100:g}%"


def text_width(text, size: float = 11) -> float:
    """Rough rendered width of a label in px (system sans-serif averages ~0.6 em per character)."""
    return len(str(text)) * size * 0.62


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (is_number(lo) and is_number(hi)) or hi <= lo:
        return [lo] if is_number(lo) else []
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 5, 10) if s * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def spread(ys: list[float], gap: float, lo: float, hi: float) -> list[float]:
    """Positions near ys, at least gap apart and inside [lo, hi] (end labels that must not overlap).

    When they cannot all fit, the top bound wins and the last labels run past hi.
    """
    order = sorted(range(len(ys)), key=ys.__getitem__)
    out = [0.0] * len(ys)
    nxt = hi + gap
    for i in reversed(order):  # from the bottom: under hi, gap apart
        nxt = min(ys[i], nxt - gap)
        out[i] = nxt
    prev = lo - gap
    for i in order:  # from the top: over lo, gap apart
        prev = max(out[i], prev + gap)
        out[i] = prev
    return out


def diverging(v) -> str:
    """Blue for agreement (+1), red for reversal (-1), white for none; grey when undefined."""
    if v is None:
        return "#e5e5e5"
    a = min(abs(v), 1.0)
    base = (33, 102, 172) if v >= 0 else (178, 24, 43)
    r, g, b = (round(255 + (c - 255) * a) for c in base)
    return f"rgb({r},{g},{b})"


def sequential(a: float) -> str:
    """White -> dark teal for accuracy 0 -> 1."""
    lo, hi = (247, 252, 253), (0, 88, 100)
    return "rgb({},{},{})".format(*(round(low + (high - low) * a) for low, high in zip(lo, hi)))


def records_of(df: pd.DataFrame) -> list[dict]:
    """Rows of a frame as JSON-safe dicts."""
    return [{k: clean(v) for k, v in row.items()} for row in df.to_dict("records")]


# ---------------------------------------------------------------- the trainable-fraction axis

LABEL_ANGLE = 40  # degrees; regime names rotate when neighbours are too close to sit level
DASHES = ("", "5 3", "1.5 3", "7 2 2 2", "3 2", "9 2 1.5 2", "1 1")  # one per family, in the order families come


def fraction_positions(regs, fractions: dict | None, width: float, inset: float = 0.0) -> tuple[dict, tuple | None]:
    """x in [0, width] per regime by log10 of its trainable fraction, and the log range shown (widened
    by `inset` of it on each side); evenly spaced (range None) when any fraction is unknown, so every
    protocol still gets a chart."""
    fr = [(fractions or {}).get(r) for r in regs]
    log = bool(regs) and all(is_number(f) and f > 0 for f in fr)
    vals = [math.log10(f) for f in fr] if log else list(range(len(regs)))
    if not vals or max(vals) - min(vals) < 1e-9:  # one regime, or one fraction: the middle
        return {r: width / 2 for r in regs}, ((vals[0] - 0.5, vals[0] + 0.5) if log else None)
    lo, hi = min(vals), max(vals)
    lo, hi = lo - inset * (hi - lo), hi + inset * (hi - lo)
    return {r: round((v - lo) / (hi - lo) * width, 1) for r, v in zip(regs, vals)}, ((lo, hi) if log else None)


def decade_ticks(span: tuple | None, width: float) -> list[dict]:
    """Ticks of a log10 range [lo, hi] mapped onto [0, width]: powers of ten, with 2x and 5x when
    fewer than two decades show; labels are percents."""
    if span is None:
        return []
    lo, hi = span
    values = [10.0 ** k for k in range(math.floor(lo), math.ceil(hi) + 1)]
    if sum(lo - 1e-9 <= math.log10(v) <= hi + 1e-9 for v in values) < 2:
        values = sorted(v * m for v in values for m in (1, 2, 5))
    inside = [v for v in values if lo - 1e-9 <= math.log10(v) <= hi + 1e-9]
    return [{"x": round((math.log10(v) - lo) / (hi - lo) * width, 1), "label": tick_percent(v)}
            for v in inside]


def top_labels(xs: dict, width: float, size: float = 10) -> dict:
    """Regime names above a plot at their x: level when neighbours fit, else rotated LABEL_ANGLE and
    spread at least 17 px apart (a leader line joins a moved name to its x). Returns the labels and
    the px they need above the plot and past its left and right edges."""
    order = sorted(xs, key=lambda r: (xs[r], r))
    w = {r: text_width(r, size) for r in order}
    level = all(xs[b] - xs[a] >= (w[a] + w[b]) / 2 + 6 for a, b in zip(order, order[1:]))
    if level:
        items = [{"regime": r, "x": xs[r], "at": xs[r], "rotate": 0} for r in order]
        return {"items": items, "top": size + 8, "left": max([w[r] / 2 - xs[r] for r in order] + [0]),
                "right": max([xs[r] + w[r] / 2 - width for r in order] + [0])}
    pos = spread([xs[r] for r in order], 17, 0, width)
    c, s = math.cos(math.radians(LABEL_ANGLE)), math.sin(math.radians(LABEL_ANGLE))
    items = [{"regime": r, "x": round(p, 1), "at": xs[r], "rotate": -LABEL_ANGLE} for r, p in zip(order, pos)]
    return {"items": items, "top": max(w.values()) * s + size * c + 14,
            "left": max([size * s - it["x"] for it in items] + [0]),
            "right": max([it["x"] + w[it["regime"]] * c - width for it in items] + [0])}


def _place(labels: dict, L: float, T: float) -> list[dict]:
    """Absolute px of top labels over a plot whose top-left corner is (L, T)."""
    return [{**it, "x": round(L + it["x"], 1), "at": round(L + it["at"], 1), "y": T - (12 if it["rotate"] else 6)}
            for it in labels["items"]]


def fraction_profile(rows: list[dict], key: str, scale: float, colours: dict, ylabel: str) -> dict | None:
    """Mean `key` (norm or forgetting) with its CI per regime against the trainable fraction (log x),
    one dashed line per family, in px; None when no regime has a value."""
    rows = [r for r in rows if is_number(r.get(key))]
    if not rows:
        return None
    regs = [r["regime"] for r in rows]
    W, H, B, size = 380, 170, 40, 10
    xs, span = fraction_positions(regs, {r["regime"]: r.get("fraction") for r in rows}, W, inset=0.05)
    labels = top_labels(xs, W, size)
    vals = [v for r in rows for v in (r[key], r.get(f"{key}_lo"), r.get(f"{key}_hi")) if is_number(v)]
    # from 0 (a size, not a difference), unless something measured lies below it
    ylo, yhi = y_limits([v * scale for v in vals] + [0.0], floor=0.0 if min(vals) >= 0 else None)
    L = math.ceil(max(46, labels["left"] + 4))
    T = math.ceil(labels["top"] + 4)

    def py(v):
        return round(T + H - (v * scale - ylo) / (yhi - ylo) * H, 1)

    fams = list(dict.fromkeys(r.get("family") or "" for r in rows))
    points = [{"regime": r["regime"], "family": r.get("family") or "", "x": round(L + xs[r["regime"]], 1),
               "y": py(r[key]), "lo": py(r[f"{key}_lo"]) if is_number(r.get(f"{key}_lo")) else None,
               "hi": py(r[f"{key}_hi"]) if is_number(r.get(f"{key}_hi")) else None, "v": r[key] * scale,
               "v_lo": r[f"{key}_lo"] * scale if is_number(r.get(f"{key}_lo")) else None,
               "v_hi": r[f"{key}_hi"] * scale if is_number(r.get(f"{key}_hi")) else None,
               "fraction": fraction_text(r.get("fraction")), "trainable": r.get("trainable"),
               "colour": colours.get(r["regime"], REGIME_COLOURS[-1])} for r in rows]
    lines = []
    for i, f in enumerate(fams):
        mine = sorted((p for p in points if p["family"] == f), key=lambda p: p["x"])
        lines.append({"family": f, "dash": DASHES[i % len(DASHES)],
                      "points": " ".join(f"{p['x']},{p['y']}" for p in mine), "n": len(mine)})
    # a legend of the family lines drawn (a family of one regime has a point, no line)
    drawn = [ln for ln in lines if ln["n"] > 1] if len(fams) > 1 else []
    legend_w = max([text_width(ln["family"], size) for ln in drawn] + [0]) + 34 if drawn else 0
    right = max(labels["right"], legend_w + 8, 10)
    return {"W": W, "H": H, "L": L, "T": T, "points": points, "lines": lines, "log": span is not None,
            "xticks": [{**t, "x": round(L + t["x"], 1)} for t in decade_ticks(span, W)],
            "yticks": [{"y": round(T + H - (v - ylo) / (yhi - ylo) * H, 1), "label": f"{v:g}"}
                       for v in nice_ticks(ylo, yhi, 5)],
            "labels": _place(labels, L, T), "ylabel": ylabel,
            "xlabel": ("trainable fraction (log scale)" if span
                       else "regime (trainable fraction unknown: evenly spaced)"),
            "legend": [{"family": ln["family"], "dash": ln["dash"], "y": T + 10 + 14 * i}
                       for i, ln in enumerate(drawn)],
            "width": math.ceil(L + W + right), "height": T + H + B}


# ---------------------------------------------------------------- rankings

def rank_whiskers(gr: pd.DataFrame, regimes) -> dict:
    """Mean rank with CI whiskers, one row per (regime, method); the left margin fits the longest label."""
    rows = records_of(gr)
    kmax = max([r["rank_hi"] or 1 for r in rows] + [2])
    label = max([text_width(f"{r['method']} ({r['regime']})") for r in rows] + [60])
    return {"rows": rows, "kmax": math.ceil(kmax), "regimes": regimes, "L": math.ceil(label) + 14}


def heatmap(tau: pd.DataFrame, regs, degenerate: dict | None = None) -> dict:
    """Kendall tau cells (tau, p) for every regime pair; degenerate regimes hatched, with their reasons."""
    degenerate = degenerate or {}
    fams = {family_of(r) for r in regs}
    index = {(a, b): row for a, b, row in zip(tau["regime_a"], tau["regime_b"], records_of(tau))}
    cells = []
    for i, a in enumerate(regs):
        for j, b in enumerate(regs):
            row = index.get((a, b), {})
            v, p = row.get("tau"), row.get("p")
            cells.append({"i": i, "j": j, "v": v, "p": p, "fill": diverging(v), "n": row.get("n_methods") or 0,
                          "note": row.get("note") or "", "hatch": a in degenerate or b in degenerate,
                          "within": i != j and family_of(a) == family_of(b) and len(fams) > 1})
    label = max([text_width(f"{r} †") for r in regs] + [40])
    c = int(min(110, max(62, label + 10)))
    return {"cells": cells, "regs": regs, "c": c, "L": math.ceil(label) + 12,
            "degenerate": [{"regime": r, "reason": degenerate[r]} for r in regs if r in degenerate],
            "marked": {r: r in degenerate for r in regs}}


def rank_shift(mt: pd.DataFrame, regs, colours: dict, fractions: dict | None = None) -> dict:
    """Mean rank per regime against the trainable fraction (log x; evenly spaced when a fraction is
    unknown), one line per method, in px; regime names on top, end labels spread apart."""
    methods = sorted(mt["method"].unique())
    lines = []
    for m in methods:
        sub = mt[mt["method"] == m].set_index("regime")
        pts = [{"x": i, "y": clean(sub.at[r, "mean_rank"]) if r in sub.index else None} for i, r in enumerate(regs)]
        lines.append({"method": m, "colour": colours.get(m, METHOD_COLOURS[0]), "pts": pts})
    kmax = math.ceil(max([p["y"] for ln in lines for p in ln["pts"] if p["y"] is not None] + [2]))
    n, gap, pad = len(regs), 13, 16
    known = bool(regs) and all(is_number((fractions or {}).get(r)) for r in regs)
    W = max(420 if known and n >= 5 else 280, 80 * (n - 1))  # on a log axis many regimes bunch: room
    xs, span = fraction_positions(regs, fractions, W)
    labels = top_labels(xs, W, 11)
    T = math.ceil(labels["top"] + 6)
    H = max(220, gap * (len(methods) + 1) + 2 * pad)  # plot from T to T + H - 2 pad, ticks below
    L = max(30, math.ceil(labels["left"]) + 4)
    sy = (H - 2 * pad) / max(kmax - 1, 1)
    ends = []
    for ln in lines:
        ln["px"] = [(round(L + xs[regs[p["x"]]], 1), round(T + (p["y"] - 1) * sy, 1)) for p in ln["pts"]
                    if p["y"] is not None]
        if ln["px"]:
            ends.append(ln)
    bottom = T + H - 2 * pad
    for ln, y in zip(ends, spread([ln["px"][-1][1] for ln in ends], gap, T, bottom)):
        ln["label"] = {"x": max(ln["px"], key=lambda q: q[0])[0] + 8, "y": round(y + 4, 1)}
    right = max([text_width(ln["method"]) for ln in ends] + [30]) + 16
    return {"lines": lines, "regs": regs, "kmax": kmax, "W": W, "H": H, "L": L, "T": T, "sy": sy,
            "bottom": bottom, "x": {r: round(L + x, 1) for r, x in xs.items()}, "labels": _place(labels, L, T - 4),
            "xticks": [{**t, "x": round(L + t["x"], 1)} for t in decade_ticks(span, W)], "log": span is not None,
            "width": math.ceil(L + W + max(right, labels["right"]) + 4), "height": bottom + 34}


def cd_diagrams(mt: pd.DataFrame, fr: pd.DataFrame, regs) -> list[dict]:
    """Critical-difference diagrams per regime: methods by mean rank, cliques closer than CD."""
    out = []
    for r in regs:
        f = fr[fr["regime"] == r]
        sub = mt[(mt["regime"] == r) & mt["mean_rank"].notna()].sort_values("mean_rank")
        if f.empty or sub.empty:
            continue
        f = records_of(f)[0]
        ranks = list(zip(sub["method"], sub["mean_rank"].astype(float)))
        label = max([text_width(f"{m} (0.00)") for m, _ in ranks] + [60])
        out.append({"regime": r, "k": len(ranks), "ranks": ranks, "cd": f["cd"], "f": f,
                    "cliques": cliques([v for _, v in ranks], f["cd"]), "L": math.ceil(label) + 24})
    return out


def cliques(sorted_ranks: list[float], cd) -> list[tuple[int, int]]:
    """Maximal runs of methods whose mean ranks differ by less than CD (not significantly different)."""
    if cd is None or len(sorted_ranks) < 2:
        return []
    spans = []
    for i in range(len(sorted_ranks)):
        j = i
        while j + 1 < len(sorted_ranks) and sorted_ranks[j + 1] - sorted_ranks[i] < cd:
            j += 1
        if j > i and not any(a <= i and j <= b for a, b in spans):
            spans.append((i, j))
    return spans


# ---------------------------------------------------------------- scatter, matrix

def scatter(runs: pd.DataFrame, nf: pd.DataFrame, regs) -> list[dict]:
    """Per regime: (mean update norm, forgetting) of ok runs (at most 600 drawn) and the correlation row."""
    ok_runs = runs[(runs["status"] == Status.OK)].dropna(subset=["mean_update_norm", "forgetting"])
    panels = []
    for r in regs:
        sub = ok_runs[ok_runs["regime"] == r]
        stat = nf[nf["regime"] == r]
        pts = list(zip(sub["mean_update_norm"].tolist(), sub["forgetting"].tolist()))[:600]
        panels.append({"regime": r, "pts": pts, "stat": records_of(stat)[0] if len(stat) else None,
                       "xr": value_range([p[0] for p in pts]), "yr": value_range([p[1] for p in pts])})
    return panels


def value_range(v) -> list[float]:
    """[lo, hi] of values, padded by 5% (never empty)."""
    if not v:
        return [0.0, 1.0]
    lo, hi = min(v), max(v)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    return [lo - pad, hi + pad]


def matrix_cells(R: list) -> dict:
    """Heatmap cells of an accuracy matrix (fractions or percents), row i = after task i."""
    cells = []
    for i, row in enumerate(R or []):
        for j, v in enumerate(row or []):
            v = v if is_number(v) else None
            a = 0.0 if v is None else max(0.0, min(1.0, v if v <= 1.5 else v / 100))
            cells.append({"i": i, "j": j, "v": v, "fill": sequential(a) if v is not None else "#e5e5e5",
                          "dark": a > 0.6})
    n = max([len(R or [])] + [len(r or []) for r in R or []])
    return {"cells": cells, "rows": len(R or []), "cols": n}


# ---------------------------------------------------------------- line panels

PANEL = {"W": 340, "H": 190, "L": 46, "T": 12, "B": 36}


def line_panel(series: list[dict], xs: list[float], ylo: float, yhi: float, *, xlabel: str, ylabel: str,
               xfmt=lambda x: f"{x:g}", vlines: list[dict] | None = None, notes: list[dict] | None = None) -> dict:
    """One line chart in px: series = [{name, colour, pts: [(x, y, lo, hi)], dash}] on shared y limits.

    vlines: [{at, colour, dash, name}] vertical marks; notes: extra legend entries ({name, colour, dash}).
    The legend sits right of the plot (inside the SVG, so a downloaded chart explains itself).
    """
    W, H, L, T, B = (PANEL[k] for k in ("W", "H", "L", "T", "B"))
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    x1 = x1 if x1 > x0 else x0 + 1

    def px(x):
        return round(L + (x - x0) / (x1 - x0) * W, 1)

    def py(y):
        return round(T + H - (y - ylo) / (yhi - ylo) * H, 1)

    drawn = []
    for s in series:
        pts = [p for p in s["pts"] if is_number(p[1])]
        band = [p for p in pts if is_number(p[2]) and is_number(p[3])]
        poly = [(px(x), py(hi)) for x, _, _, hi in band] + [(px(x), py(lo)) for x, _, lo, _ in reversed(band)]
        drawn.append({"name": s["name"], "colour": s["colour"], "dash": s.get("dash", ""),
                      "line": " ".join(f"{px(x)},{py(y)}" for x, y, _, _ in pts),
                      "dots": [{"x": px(x), "y": py(y), "v": y, "lo": lo, "hi": hi, "at": x} for x, y, lo, hi in pts],
                      "band": " ".join(f"{a},{b}" for a, b in poly) if len(band) > 1 else ""})
    legend = [{"name": s["name"], "colour": s["colour"], "dash": s.get("dash", ""), "vline": False} for s in series] + \
        [{"name": e["name"], "colour": e["colour"], "dash": e.get("dash", ""), "vline": True} for e in notes or []]
    right = max([text_width(e["name"], 10) for e in legend] + [20]) + 34
    height = max(T + H + B, T + 14 * len(legend) + 8)
    return {"series": drawn, "W": W, "H": H, "L": L, "T": T, "x0": L, "x1": L + W,
            "width": math.ceil(L + W + right), "height": height, "xlabel": xlabel, "ylabel": ylabel,
            "xticks": [{"x": px(x), "label": xfmt(x)} for x in _x_ticks(xs)],
            "yticks": [{"y": py(y), "label": f"{y:g}"} for y in nice_ticks(ylo, yhi, 5)],
            "vlines": [{**v, "x": px(v["at"])} for v in vlines or [] if is_number(v.get("at")) and x0 <= v["at"] <= x1],
            "legend": [{**e, "y": T + 10 + 14 * i} for i, e in enumerate(legend)]}


def _x_ticks(xs: list[float]) -> list[float]:
    """Every x when there are few (tasks), else round ticks."""
    xs = sorted(set(xs))
    return xs if len(xs) <= 12 else nice_ticks(xs[0], xs[-1], 6)


def y_limits(values: list[float], floor: float | None = None, ceil: float | None = None) -> tuple[float, float]:
    """Padded y limits of values on round numbers, clipped to [floor, ceil] when given."""
    v = [x for x in values if is_number(x)]
    if not v:
        return (0.0, 1.0)
    lo, hi = min(v), max(v)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    ticks = nice_ticks(lo - pad, hi + pad, 5)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else pad
    lo, hi = math.floor((lo - pad) / step) * step, math.ceil((hi + pad) / step) * step
    lo = max(lo, floor) if floor is not None else lo
    hi = min(hi, ceil) if ceil is not None else hi
    return (lo, hi if hi > lo else lo + 1)


def curve_panels(curves: pd.DataFrame, regs, colours: dict, scale: float) -> list[dict]:
    """Accuracy on tasks seen so far vs task, one panel per regime, one line (+ CI band) per method.

    All panels share the y axis, so regimes compare at a glance.
    """
    if curves.empty:
        return []
    c = curves.assign(y=curves["acc"] * scale, lo=curves["acc_lo"] * scale, hi=curves["acc_hi"] * scale)
    ylo, yhi = y_limits(c["lo"].tolist() + c["hi"].tolist() + c["y"].tolist(), 0.0, 100.0 if scale == 100 else 1.0)
    panels = []
    for rg in regs:
        sub = c[c["regime"] == rg]
        if sub.empty:
            continue
        series = [{"name": m, "colour": colours.get(m, METHOD_COLOURS[0]),
                   "pts": [(float(t), clean(y), clean(lo), clean(hi)) for t, y, lo, hi in
                           zip(g["task"], g["y"], g["lo"], g["hi"])]}
                  for m, g in sub.sort_values("task").groupby("method", sort=True)]
        xs = sorted({float(t) for t in sub["task"]})
        panels.append({"regime": rg, **line_panel(series, xs, ylo, yhi, xlabel="after training task t",
                                                  ylabel="ACC on tasks 1..t" + (" %" if scale == 100 else ""),
                                                  xfmt=lambda x: num(x, 0))})
    return panels


def task_colour(i: int, n: int) -> str:
    """The i-th of n task colours, spread over the light-to-dark palette."""
    k = len(TASK_COLOURS) - 1
    return TASK_COLOURS[round(i * k / (n - 1)) if n > 1 else k - 2]


def sweep_panel(sweep: Sweep, scale: float) -> dict:
    """A swept diagnostic (e.g. BECAME's accuracy over alpha): one mean curve per task, the chosen value
    of the swept parameter as a solid vertical line, any other recorded value (the closed form) dashed."""
    xk, yk, pct = sweep.x, sweep.y, sweep.percent
    f = scale if pct else 1.0
    series, vlines, rows, ys = [], [], [], []
    tasks = sorted(sweep.tasks)
    for i, t in enumerate(tasks):
        task = sweep.tasks[t]
        colour = task_colour(i, len(tasks))
        pts = [(x, sum(v) / len(v) * f) for x, v in sorted(task.points.items())]
        ys += [y for _, y in pts]
        series.append({"name": f"task {t}", "colour": colour, "pts": [(x, y, None, None) for x, y in pts]})
        marks = {k: sum(v) / len(v) for k, v in task.marks.items()}
        chosen = marks.get(xk)
        for name, at in marks.items():
            if name != xk and chosen is not None and abs(at - chosen) < 1e-6:
                continue  # the same value as the chosen one: one line says both
            vlines.append({"at": at, "colour": colour, "dash": "" if name == xk else "4 3", "task": t, "mark": name,
                           "name": f"{'chosen ' + xk if name == xk else name} = {num(at, 3)} (task {t})"})
        best = max(pts, key=lambda p: p[1]) if pts else (None, None)
        rows.append({"task": t, "n": task.n, "marks": marks, "best_x": best[0], "best_y": best[1]})
    ylo, yhi = y_limits(ys, 0.0, 100.0 if f == 100 else None)
    others = sorted({k for r in rows for k in r["marks"] if k != xk})
    dashed = sorted({v["mark"] for v in vlines if v["dash"]})
    same = [k for k in others if k not in dashed]  # recorded, and equal to the chosen value everywhere
    notes = [{"name": f"chosen {xk}", "colour": "#555", "dash": ""}] + \
        [{"name": k, "colour": "#555", "dash": "4 3"} for k in dashed]
    panel = line_panel(series, sorted({x for s in series for x, *_ in s["pts"]}), ylo, yhi,
                       xlabel=xk, ylabel=yk + (" %" if f == 100 else ""), vlines=vlines, notes=notes)
    return {**panel, "rows": rows, "x_key": xk, "y_key": yk, "others": others, "same": same, "percent": f == 100}


# ---------------------------------------------------------------- any-time curves (continual evaluation)

CURVE = {"W": 420, "H": 200, "L": 46, "T": 12, "B": 38}
BOUNDARY = "#9aa3ad"  # task boundaries: a light dashed grey under the lines


def curve_chart(series: list[dict], ylo: float, yhi: float, *, xlabel: str, ylabel: str, xticks: list[dict],
                x0: float, x1: float, vlines: list[dict] | None = None, notes: list[dict] | None = None,
                size: dict | None = None) -> dict:
    """A line chart in px whose lines break: series = [{name, colour, segments: [[(x, y, lo, hi, end, at)]]}],
    each segment its own polyline and CI band; a point with end=True is drawn as a task's end point (a ring),
    `at` is its hover text. xticks = [{x, label}] in data units; vlines = [{at, name}] task boundaries;
    notes: extra legend entries ({name, kind: "end" | "boundary"}). size overrides CURVE's W, H, L, T, B.
    The legend sits right of the plot, inside the SVG (a downloaded chart explains itself)."""
    g = {**CURVE, **(size or {})}
    W, H, L, T, B = (g[k] for k in ("W", "H", "L", "T", "B"))
    x1 = x1 if x1 > x0 else x0 + 1
    yhi = yhi if yhi > ylo else ylo + 1

    def px(x):
        return round(L + (x - x0) / (x1 - x0) * W, 1)

    def py(y):
        return round(T + H - (min(max(y, ylo), yhi) - ylo) / (yhi - ylo) * H, 1)

    drawn = []
    for s in series:
        lines, bands, dots = [], [], []
        for seg in s["segments"]:
            pts = [p for p in seg if is_number(p[1])]
            if len(pts) > 1:
                lines.append(" ".join(f"{px(p[0])},{py(p[1])}" for p in pts))
            band = [p for p in pts if is_number(p[2]) and is_number(p[3])]
            if len(band) > 1:
                poly = [(px(p[0]), py(p[3])) for p in band] + [(px(p[0]), py(p[2])) for p in reversed(band)]
                bands.append(" ".join(f"{a},{b}" for a, b in poly))
            dots += [{"x": px(p[0]), "y": py(p[1]), "v": p[1], "lo": clean(p[2]), "hi": clean(p[3]),
                      "end": bool(p[4]), "at": p[5]} for p in pts]
        drawn.append({"name": s["name"], "colour": s["colour"], "lines": lines, "bands": bands, "dots": dots})
    legend = [{"name": s["name"], "colour": s["colour"], "kind": "line"} for s in series] + \
        [{"name": e["name"], "colour": e.get("colour", "#555"), "kind": e["kind"]} for e in notes or []]
    right = max([text_width(e["name"], 10) for e in legend] + [20]) + 34
    return {"series": drawn, "W": W, "H": H, "L": L, "T": T, "x0": L, "x1": L + W, "xlabel": xlabel,
            "ylabel": ylabel, "width": math.ceil(L + W + right),
            "height": max(T + H + B, T + 14 * len(legend) + 8),
            "xticks": [{"x": px(t["x"]), "label": t["label"]} for t in xticks if x0 <= t["x"] <= x1],
            "yticks": [{"y": py(y), "label": f"{y:g}"} for y in nice_ticks(ylo, yhi, 5)],
            "vlines": [{"x": px(v["at"]), "name": v["name"]} for v in vlines or []
                       if is_number(v.get("at")) and x0 <= v["at"] <= x1],
            "legend": [{**e, "y": T + 10 + 14 * i} for i, e in enumerate(legend)]}


def _ci(v, lo, hi, scale):
    """(y, lo, hi) scaled, None where missing."""
    return tuple(clean(float(x)) * scale if is_number(clean(x)) else None for x in (v, lo, hi))


def anytime_panels(curves: pd.DataFrame, regs, colours: dict, scale: float, key: str = "old_acc") -> list[dict]:
    """Accuracy on the old tasks during training (continual evaluation), one panel per regime, one line per
    method (mean over runs, 95% CI band), x in tasks: task k trains from x = k - 1 to x = k.

    Each task's segment is drawn on its own (the old tasks change at a boundary). It starts at the accuracy
    on the same old tasks before the task's first update: the previous task's end point on the tasks seen
    (`seen_acc`, which averages exactly those tasks), unless the table has a point of its own there. End
    points (the evaluated model, as in the accuracy matrix) are rings. All panels share the y axis.
    """
    if curves.empty:
        return []
    ends = curves[curves["end"].astype(bool)]  # their seen_acc starts the next task's segment
    vals = [v * scale for df, cols in ((curves, (key, f"{key}_lo", f"{key}_hi")),
                                       (ends, ("seen_acc", "seen_acc_lo", "seen_acc_hi")))
            for col in cols for v in df[col].tolist() if is_number(clean(v))]
    ylo, yhi = y_limits(vals, 0.0, 100.0 if scale == 100 else 1.0)
    n_tasks = int(curves["task"].max())
    first = float(min(n_tasks - 1, 1))  # task 1 has no old tasks: the axis starts at its end
    ticks = [{"x": k - 0.5, "label": f"t{k}"} for k in range(1, n_tasks + 1)]
    vlines = [{"at": float(k), "name": f"end of task {k}"} for k in range(1, n_tasks)]
    notes = [{"name": "task end (evaluated model)", "kind": "end"}, {"name": "task boundary", "kind": "boundary"}]
    unit = " %" if scale == 100 else ""
    panels = []
    for rg in regs:
        sub = curves[curves["regime"] == rg]
        if sub.empty or not sub[key].notna().any():
            continue
        series = []
        for m, g in sub.groupby("method", sort=True):
            g = g.sort_values(["task", "x", "point"])
            segments = []
            for k, seg in g.groupby("task", sort=True):
                pts = [(float(x), *_ci(v, lo, hi, scale), bool(e), f"task {k}, step {int(o)} of the task, n = {int(n)}")
                       for x, v, lo, hi, e, o, n in zip(seg["x"], seg[key], seg[f"{key}_lo"], seg[f"{key}_hi"],
                                                       seg["end"], seg["offset"], seg["n"])]
                prev = g[(g["task"] == k - 1) & g["end"].astype(bool)]
                if len(prev) and not (seg["x"] <= k - 1 + 1e-9).any():
                    r = prev.iloc[-1]
                    pts.insert(0, (float(k - 1), *_ci(r["seen_acc"], r["seen_acc_lo"], r["seen_acc_hi"], scale), True,
                                   f"end of task {k - 1}: tasks 1..{k - 1} before task {k}, n = {int(r['n'])}"))
                segments.append([p for p in pts if p[1] is not None])
            series.append({"name": m, "colour": colours.get(m, METHOD_COLOURS[0]), "segments": segments})
        panels.append({"regime": rg, **curve_chart(
            series, ylo, yhi, xlabel="training task (boundaries dashed)", ylabel="ACC on old tasks" + unit,
            xticks=ticks, x0=first, x1=float(n_tasks), vlines=vlines, notes=notes, size={"W": 700, "H": 220})})
    return panels


def run_curve(curve: dict, scale: float, key: str = "acc") -> dict | None:
    """One run's continual-evaluation curve (record.curve): accuracy on every task seen so far against the
    optimizer step, one line per task (from its first point on), task ends as rings, boundaries dashed."""
    steps, tasks, ends, acc = (curve.get(k) or [] for k in ("steps", "task", "end", key))
    if not steps or len(acc) != len(steps):
        return None
    n = max([len(row or []) for row in acc] + [0])
    series, vals = [], []
    for j in range(n):
        pts = [(float(steps[p]), float(acc[p][j]) * scale, None, None, bool(ends[p]) if p < len(ends) else False,
                f"step {steps[p]} (training task {tasks[p] + 1}{', its end' if p < len(ends) and ends[p] else ''})")
               for p in range(len(steps)) if j < len(acc[p] or []) and is_number(acc[p][j])]
        if pts:
            vals += [p[1] for p in pts]
            # one hue per task (not the light-to-dark task scale): crossing lines must stay apart
            series.append({"name": f"task {j + 1}", "colour": METHOD_COLOURS[j % len(METHOD_COLOURS)],
                           "segments": [pts]})
    if not series:
        return None
    bounds = [float(s) for s, e in zip(steps, ends) if e]
    ylo, yhi = y_limits(vals, 0.0, 100.0 if scale == 100 else 1.0)
    x1 = float(max(steps)) or 1.0
    ticks = [{"x": v, "label": f"{v:g}"} for v in nice_ticks(0.0, x1, 8)]
    notes = [{"name": "task end (evaluated model)", "kind": "end"}, {"name": "task boundary", "kind": "boundary"}]
    return curve_chart(series, ylo, yhi, xlabel="optimizer step", ylabel="accuracy" + (" %" if scale == 100 else ""),
                       xticks=ticks, x0=0.0, x1=x1, notes=notes, size={"W": 780, "H": 240},
                       vlines=[{"at": b, "name": f"end of task {i + 1} (step {b:g})"}
                               for i, b in enumerate(bounds[:-1])])
