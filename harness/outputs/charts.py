"""Chart geometry for the leaderboard's inline SVG: analysis frames in, plain numbers out.

The templates (leaderboard/templates/charts.html) only draw what these functions return. Charts
whose layout depends on their labels (margins sized to the longest name, end labels spread apart,
panels sharing one axis) are laid out here in pixels, so the layout can be tested without a browser.
"""
from __future__ import annotations

import math

import pandas as pd

# One colour per regime, light (shallow) to dark (deep): depth reads as intensity.
REGIME_COLOURS = ("#f4a259", "#e76f51", "#b5446e", "#6a4c93", "#1d3557", "#0b132b")
METHOD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# Light to dark: later tasks darker, as the regimes.
TASK_COLOURS = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b", "#041a3a")


def ok(x) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def clean(v):
    """JSON-safe scalar (NaN -> None, numpy -> Python)."""
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def text_width(text, size: float = 11) -> float:
    """Rough rendered width of a label in px (system sans-serif averages ~0.6 em per character)."""
    return len(str(text)) * size * 0.62


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (ok(lo) and ok(hi)) or hi <= lo:
        return [lo] if ok(lo) else []
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
    return "rgb({},{},{})".format(*(round(l + (h - l) * a) for l, h in zip(lo, hi)))


def records_of(df: pd.DataFrame) -> list[dict]:
    """Rows of a frame as JSON-safe dicts."""
    return [{k: clean(v) for k, v in row.items()} for row in df.to_dict("records")]


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
    index = {(a, b): row for a, b, row in zip(tau["regime_a"], tau["regime_b"], records_of(tau))}
    cells = []
    for i, a in enumerate(regs):
        for j, b in enumerate(regs):
            row = index.get((a, b), {})
            v, p = row.get("tau"), row.get("p")
            cells.append({"i": i, "j": j, "v": v, "p": p, "fill": diverging(v), "n": row.get("n_methods") or 0,
                          "note": row.get("note") or "", "hatch": a in degenerate or b in degenerate})
    label = max([text_width(f"{r} †") for r in regs] + [40])
    c = int(min(110, max(62, label + 10)))
    return {"cells": cells, "regs": regs, "c": c, "L": math.ceil(label) + 12,
            "degenerate": [{"regime": r, "reason": degenerate[r]} for r in regs if r in degenerate],
            "marked": {r: r in degenerate for r in regs}}


def rank_shift(mt: pd.DataFrame, regs, colours: dict) -> dict:
    """Mean rank per regime, one line per method, laid out in px; end labels spread so they never overlap."""
    methods = sorted(mt["method"].unique())
    lines = []
    for m in methods:
        sub = mt[mt["method"] == m].set_index("regime")
        pts = [{"x": i, "y": clean(sub.at[r, "mean_rank"]) if r in sub.index else None} for i, r in enumerate(regs)]
        lines.append({"method": m, "colour": colours.get(m, METHOD_COLOURS[0]), "pts": pts})
    kmax = math.ceil(max([p["y"] for ln in lines for p in ln["pts"] if p["y"] is not None] + [2]))
    n, T, gap = len(regs), 16, 13
    W = max(280, 80 * (n - 1))
    H = max(220, gap * (len(methods) + 1) + 2 * T)
    L = max(30, math.ceil(text_width(regs[0], 11) / 2) + 4) if regs else 30
    sx = W / max(n - 1, 1)
    sy = (H - 2 * T) / max(kmax - 1, 1)
    ends = []
    for ln in lines:
        ln["px"] = [(round(L + p["x"] * sx, 1), round(T + (p["y"] - 1) * sy, 1)) for p in ln["pts"] if p["y"] is not None]
        if ln["px"]:
            ends.append(ln)
    for ln, y in zip(ends, spread([ln["px"][-1][1] for ln in ends], gap, T, H - T)):
        ln["label"] = {"x": ln["px"][-1][0] + 8, "y": round(y + 4, 1)}
    right = max([text_width(ln["method"]) for ln in ends] + [30]) + 16
    last = max(text_width(regs[-1], 11) / 2 if regs else 0, 0)
    return {"lines": lines, "regs": regs, "kmax": kmax, "W": W, "H": H, "L": L, "T": T, "sx": sx, "sy": sy,
            "width": math.ceil(L + W + max(right, last) + 4), "height": H + 26}


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
    ok_runs = runs[(runs["status"] == "ok")].dropna(subset=["mean_update_norm", "forgetting"])
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
            v = v if ok(v) else None
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
        pts = [p for p in s["pts"] if ok(p[1])]
        band = [p for p in pts if ok(p[2]) and ok(p[3])]
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
            "vlines": [{**v, "x": px(v["at"])} for v in vlines or [] if ok(v.get("at")) and x0 <= v["at"] <= x1],
            "legend": [{**e, "y": T + 10 + 14 * i} for i, e in enumerate(legend)]}


def _x_ticks(xs: list[float]) -> list[float]:
    """Every x when there are few (tasks), else round ticks."""
    xs = sorted(set(xs))
    return xs if len(xs) <= 12 else nice_ticks(xs[0], xs[-1], 6)


def y_limits(values: list[float], floor: float | None = None, ceil: float | None = None) -> tuple[float, float]:
    """Padded y limits of values on round numbers, clipped to [floor, ceil] when given."""
    v = [x for x in values if ok(x)]
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
    if curves is None or curves.empty:
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
                                                  xfmt=lambda x: f"{x:.0f}")})
    return panels


def task_colour(i: int, n: int) -> str:
    """The i-th of n task colours, spread over the light-to-dark palette."""
    k = len(TASK_COLOURS) - 1
    return TASK_COLOURS[round(i * k / (n - 1)) if n > 1 else k - 2]


def sweep_panel(slot: dict, scale: float) -> dict:
    """A swept diagnostic (e.g. BECAME's accuracy over alpha): one mean curve per task, the chosen value
    of the swept parameter as a solid vertical line, any other recorded value (the closed form) dashed."""
    xk, yk, pct = slot["x"], slot["y"], slot["percent"]
    f = scale if pct else 1.0
    series, vlines, rows, ys = [], [], [], []
    tasks = sorted(slot["tasks"])
    for i, t in enumerate(tasks):
        task = slot["tasks"][t]
        colour = task_colour(i, len(tasks))
        pts = [(x, sum(v) / len(v) * f) for x, v in sorted(task["pts"].items())]
        ys += [y for _, y in pts]
        series.append({"name": f"task {t}", "colour": colour, "pts": [(x, y, None, None) for x, y in pts]})
        marks = {k: sum(v) / len(v) for k, v in task["marks"].items()}
        chosen = marks.get(xk)
        for name, at in marks.items():
            if name != xk and chosen is not None and abs(at - chosen) < 1e-6:
                continue  # the same value as the chosen one: one line says both
            vlines.append({"at": at, "colour": colour, "dash": "" if name == xk else "4 3", "task": t, "mark": name,
                           "name": f"{'chosen ' + xk if name == xk else name} = {at:.3f} (task {t})"})
        best = max(pts, key=lambda p: p[1]) if pts else (None, None)
        rows.append({"task": t, "n": task["n"], "marks": marks, "best_x": best[0], "best_y": best[1]})
    ylo, yhi = y_limits(ys, 0.0, 100.0 if f == 100 else None)
    others = sorted({k for r in rows for k in r["marks"] if k != xk})
    dashed = sorted({v["mark"] for v in vlines if v["dash"]})
    same = [k for k in others if k not in dashed]  # recorded, and equal to the chosen value everywhere
    notes = [{"name": f"chosen {xk}", "colour": "#555", "dash": ""}] + \
        [{"name": k, "colour": "#555", "dash": "4 3"} for k in dashed]
    panel = line_panel(series, sorted({x for s in series for x, *_ in s["pts"]}), ylo, yhi,
                       xlabel=xk, ylabel=yk + (" %" if f == 100 else ""), vlines=vlines, notes=notes)
    return {**panel, "rows": rows, "x_key": xk, "y_key": yk, "others": others, "same": same, "percent": f == 100}
