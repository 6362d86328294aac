"""Static HTML leaderboard: analysis tables -> jinja2 templates (autoescaped) -> a folder of pages.

Self-contained: CSS, SVG and the sort script are inlined, links are relative, so the site
opens from file:// and can be copied anywhere. Chart geometry is computed here as plain
numbers; the templates (leaderboard/templates/) only draw it.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import jinja2
import pandas as pd

from ..analysis.frame import FLAG, percent_scale, regime_order
from ..analysis.tables import analyse, headline
from ..config.paths import REPOSITORY
from ..config.specs import RunRecord
from ..config.text import spreadsheet_safe
from ..config.vocabulary import WARNINGS
from ..execution.reproduce import reproduce_command

TEMPLATES = REPOSITORY / "leaderboard" / "templates"
# One colour per regime, light (shallow) to dark (deep): depth reads as intensity.
REGIME_COLOURS = ("#f4a259", "#e76f51", "#b5446e", "#6a4c93", "#1d3557", "#0b132b")
METHOD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def slug(name: str) -> str:
    """File-name-safe, collision-free slug of any string (readable prefix + short hash)."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", str(name)).strip("-").lower()[:40] or "x"
    return f"{base}-{hashlib.sha1(str(name).encode()).hexdigest()[:6]}"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(num=_num, pct=lambda x, s=100.0: _num(x * s if _ok(x) else x, 1),
                       slug=slug, tojson_compact=lambda v: json.dumps(v, default=str),
                       thousands=_thousands, flag_title=flag_title)
    return env


def _thousands(x) -> str:
    """A whole number with thousands separators (1,234), or an em dash for missing values."""
    return f"{round(x):,}" if _ok(x) else "—"


def flag_title(codes: str) -> str:
    """Hover text of a flag mark: each comma-joined warning code with its meaning."""
    items = [c for c in str(codes or "").split(",") if c]
    # Unknown codes (records from another harness version) are shown without a meaning.
    if not items:
        return ""
    return "learning-check warnings: " + "; ".join(f"{c} ({WARNINGS[c]})" if c in WARNINGS else c for c in items)


def _ok(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x, digits: int = 3) -> str:
    """Fixed-point text, or an em dash for missing values."""
    return f"{x:.{digits}f}" if _ok(x) else "—"


def _clean(v):
    """JSON-safe scalar (NaN -> None, numpy -> Python)."""
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _records_of(df: pd.DataFrame) -> list[dict]:
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


class _Writer:
    """Writes pages and their downloadable tables, remembers what it wrote, and prunes stale files.

    The folder may be the user's own (`--out`): only a file the previous build listed in its
    manifest, still holding the bytes that build wrote, is ever deleted. Use it as a context
    manager; leaving the block prunes and writes the new manifest.
    """

    MANIFEST = ".cl-bench-site.json"

    def __init__(self, out: Path, env: jinja2.Environment, base: dict):
        self.out, self.env, self.base = out, env, base
        (out / "data").mkdir(parents=True, exist_ok=True)
        (out / "runs").mkdir(exist_ok=True)
        self.pages: list[Path] = []
        self.tables: list[Path] = []
        self.written: dict[str, str] = {}  # relative POSIX path -> sha256 of the bytes written
        self.previous = self._read_manifest()

    def __enter__(self) -> "_Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._save_manifest({**self._prune(), **self.written})
            return False
        try:  # a failed build deletes nothing and forgets nothing: the next build prunes
            self._save_manifest({**self.previous, **self.written})
        except OSError:
            pass  # the build's own error is the one to report
        return False

    def table(self, df: pd.DataFrame, stem: str) -> dict:
        """Write df as data/<stem>.csv and .json; return the relative links."""
        links = {"csv": f"data/{stem}.csv", "json": f"data/{stem}.json"}
        self.tables.append(self._write(links["csv"], self._spreadsheet_safe(df).to_csv(index=False)))
        # The JSON keeps the raw values: it is data for programs, not a spreadsheet.
        self.tables.append(self._write(links["json"], json.dumps(_records_of(df), default=str)))
        return links

    def page(self, template: str, rel: str, **ctx) -> Path:
        """Render template to out/rel (links relative to it); return its path."""
        root = "../" * rel.count("/")
        html = self.env.get_template(template).render(**self.base, root=root, **ctx)
        path = self._write(rel, html)
        self.pages.append(path)
        return path

    @staticmethod
    def _spreadsheet_safe(df: pd.DataFrame) -> pd.DataFrame:
        """A copy whose text cells cannot start a spreadsheet formula; numbers stay numbers."""
        text = df.select_dtypes(include=["object", "string"]).columns
        return df.assign(**{c: df[c].map(spreadsheet_safe) for c in text})

    def _write(self, rel: str, text: str) -> Path:
        path, data = self.out / rel, text.encode("utf-8")
        path.write_bytes(data)
        self.written[rel] = hashlib.sha256(data).hexdigest()
        return path

    def _read_manifest(self) -> dict[str, str]:
        """{relative path: sha256} from the previous build; empty when missing or unreadable."""
        try:
            files = json.loads((self.out / self.MANIFEST).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        if not isinstance(files, dict):
            return {}
        return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}

    def _save_manifest(self, files: dict[str, str]) -> None:
        doc = {"about": "files written by the last cl-bench site build", "files": dict(sorted(files.items()))}
        (self.out / self.MANIFEST).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    def _prune(self) -> dict[str, str]:
        """Delete the previous build's files this build did not write; return those that could not be."""
        kept = {}
        for rel, digest in self.previous.items():
            path = None if rel in self.written else self._site_file(rel, digest)
            if path is None:
                continue
            try:
                path.unlink()
            except OSError:
                kept[rel] = digest  # still ours: try again next build
        return kept

    def _site_file(self, rel: str, digest: str) -> Path | None:
        """out/rel if it is a plain file inside out that still holds what the site wrote, else None."""
        path = self.out / rel
        try:
            inside = path.resolve().is_relative_to(self.out.resolve())
            if rel == self.MANIFEST or not inside or path.is_symlink() or not path.is_file():
                return None  # a manifest can be edited by hand: never trust it to point elsewhere
            return path if hashlib.sha256(path.read_bytes()).hexdigest() == digest else None
        except (OSError, ValueError):
            return None


def build_site(records: list[RunRecord], out_dir: Path, *, results_dir: str | None = None,
               include_flagged: bool = False) -> Path:
    """Render the whole leaderboard for a list of records; returns index.html's path.

    Flagged runs (learning-check warnings) are shown and marked everywhere, and left out of
    the rankings unless include_flagged.
    """
    out = Path(out_dir)
    tables = analyse(records, include_flagged=include_flagged)
    frame = tables["runs"]
    regimes = regime_order(frame)
    base = {"protocol": _protocol(records), "scale": percent_scale(frame), "regimes": regimes,
            "regime_colour": {r: REGIME_COLOURS[min(i, len(REGIME_COLOURS) - 1)] for i, r in enumerate(regimes)},
            "datasets": sorted(frame["dataset"].unique()), "methods": sorted(frame["method"].unique()),
            "results_dir": results_dir, "include_flagged": include_flagged, "flag": FLAG,
            "warning_text": WARNINGS}
    with _Writer(out, _env(), base) as w:  # on leaving: files of the previous build not rewritten go
        index = _overview(w, tables, records)
        for ds in base["datasets"]:
            _dataset_page(w, tables, ds)
        for m in base["methods"]:
            _method_page(w, tables, records, m)
        for rec in records:
            _run_page(w, rec, base)
    return index


def _protocol(records) -> dict:
    names = sorted({r.spec.protocol for r in records})
    versions = sorted({r.spec.protocol_version for r in records})
    return {"name": ", ".join(names), "version": ", ".join(versions), "cli_name": names[0] if names else ""}


def site_summary_line(path) -> str:
    """One line for the terminal: where the site is and how many pages it has."""
    p = Path(path)
    index = p / "index.html" if p.is_dir() else p
    n = sum(1 for _ in index.parent.rglob("*.html"))
    return f"leaderboard: {index.resolve()} ({n} pages; open it in a browser, no server needed)"


# ---------------------------------------------------------------- overview

def _overview(w: _Writer, t: dict, records) -> Path:
    frame = t["runs"]
    status = frame.groupby(["dataset", "status"]).size().unstack(fill_value=0)
    flagged_per = frame.groupby("dataset")["flagged"].sum()
    gr = t["global_ranks"]
    ctx = {
        "title": "Overview", "n_runs": len(frame),
        "status_counts": frame["status"].value_counts().to_dict(),
        "status_table": [{"dataset": ds, **{k: int(v) for k, v in row.items()}, "_flagged": int(flagged_per[ds])}
                         for ds, row in status.iterrows()],
        "statuses": list(status.columns),
        "headline": headline(t),
        "flagged": _records_of(t["flagged"]), "budget": _budget_summary(t["budget"]),
        "unranked": [r for r in w.base["regimes"] if r not in set(gr["regime"])],
        "global": {rg: _records_of(sub) for rg, sub in gr.groupby("regime", sort=False)},
        "global_chart": _rank_whiskers(gr, w.base["regimes"]),
        "failed": _records_of(frame[frame["status"] != "ok"][["run_id", "dataset", "regime", "method", "order", "seed", "status", "error"]]),
        "w_regimes": _records_of(t["w_regimes"]),
        "downloads": {"global ranking": w.table(gr, "global_ranks"), "coverage": w.table(t["coverage"], "coverage"),
                      "all runs": w.table(frame, "runs"), "agreement (W across regimes)": w.table(t["w_regimes"], "w_regimes"),
                      "flagged runs": w.table(t["flagged"], "flagged"), "training budget": w.table(t["budget"], "budget")},
    }
    return w.page("index.html", "index.html", **ctx)


def _budget_summary(budget: pd.DataFrame) -> dict:
    """Per-method budget rows, and whether methods differ (the overview shows the table only then)."""
    rows = _records_of(budget)
    rel = [r["relative_steps"] for r in rows if r["relative_steps"] is not None]
    # 1% slack: steps follow the sample counts, which differ a little between task orders.
    return {"rows": rows, "differs": bool(rel) and max(rel) - min(rel) > 0.01}


def _rank_whiskers(gr: pd.DataFrame, regimes) -> dict:
    """Mean rank with CI whiskers, one row per (regime, method)."""
    rows = _records_of(gr)
    kmax = max([r["rank_hi"] or 1 for r in rows] + [2])
    return {"rows": rows, "kmax": math.ceil(kmax), "regimes": regimes}


# ---------------------------------------------------------------- dataset page

def _dataset_page(w: _Writer, t: dict, ds: str) -> Path:
    sel = {k: v[v["dataset"] == ds] for k, v in t.items() if "dataset" in v.columns}
    s = slug(ds)
    regs = [r for r in w.base["regimes"] if r in set(sel["methods"]["regime"])]
    ctx = {
        "title": ds, "dataset": ds, "regs": regs,
        "rows": _records_of(sel["methods"]),
        "tau": _heatmap(sel["tau"], regs),
        "rank_shift": _rank_shift(sel["methods"], regs),
        "scatter": _scatter(sel["runs"], sel["norm_forgetting"], regs),
        "profile": _records_of(sel["depth_profile"]),
        "trend": _records_of(sel["depth_trend"]),
        "cd": _cd_diagrams(sel["methods"], sel["friedman"], regs),
        "friedman": _records_of(sel["friedman"]), "w_orders": _records_of(sel["w_orders"]),
        "w_regimes": _records_of(sel["w_regimes"]), "reversals": _records_of(sel["reversals"]),
        "reversal_summary": _records_of(sel["reversal_summary"]),
        "norm_forgetting": _records_of(sel["norm_forgetting"]), "step_level": _records_of(sel["step_level"]),
        "downloads": {name: w.table(sel[key], f"{s}-{key}") for name, key in (
            ("method x regime", "methods"), ("Kendall tau", "tau"), ("rank reversals", "reversals"),
            ("Friedman + CD", "friedman"), ("W across orders", "w_orders"),
            ("norm vs forgetting", "norm_forgetting"), ("depth profile", "depth_profile"),
            ("depth trend", "depth_trend"), ("step level", "step_level"), ("runs", "runs"))},
    }
    return w.page("dataset.html", f"dataset-{s}.html", **ctx)


def _heatmap(tau: pd.DataFrame, regs) -> dict:
    cells = []
    for i, a in enumerate(regs):
        for j, b in enumerate(regs):
            row = tau[(tau["regime_a"] == a) & (tau["regime_b"] == b)]
            v = _clean(row["tau"].iloc[0]) if len(row) else None
            p = _clean(row["p"].iloc[0]) if len(row) else None
            cells.append({"i": i, "j": j, "v": v, "p": p, "fill": _diverging(v),
                          "n": int(row["n_methods"].iloc[0]) if len(row) else 0})
    return {"cells": cells, "regs": regs}


def _diverging(v) -> str:
    """Blue for agreement (+1), red for reversal (-1), white for none; grey when undefined."""
    if v is None:
        return "#e5e5e5"
    a = min(abs(v), 1.0)
    base = (33, 102, 172) if v >= 0 else (178, 24, 43)
    r, g, b = (round(255 + (c - 255) * a) for c in base)
    return f"rgb({r},{g},{b})"


def _rank_shift(mt: pd.DataFrame, regs) -> dict:
    lines = []
    methods = sorted(mt["method"].unique())
    for k, m in enumerate(methods):
        sub = mt[mt["method"] == m].set_index("regime")
        pts = [{"x": i, "y": _clean(sub.at[r, "mean_rank"]) if r in sub.index else None} for i, r in enumerate(regs)]
        lines.append({"method": m, "colour": METHOD_COLOURS[k % len(METHOD_COLOURS)], "pts": pts})
    kmax = max([p["y"] for ln in lines for p in ln["pts"] if p["y"] is not None] + [2])
    return {"lines": lines, "regs": regs, "kmax": math.ceil(kmax)}


def _scatter(runs: pd.DataFrame, nf: pd.DataFrame, regs) -> list[dict]:
    ok = runs[(runs["status"] == "ok")].dropna(subset=["mean_update_norm", "forgetting"])
    panels = []
    for r in regs:
        sub = ok[ok["regime"] == r]
        stat = nf[nf["regime"] == r]
        pts = list(zip(sub["mean_update_norm"].tolist(), sub["forgetting"].tolist()))[:600]
        panels.append({"regime": r, "pts": pts, "stat": _records_of(stat)[0] if len(stat) else None,
                       "xr": _range([p[0] for p in pts]), "yr": _range([p[1] for p in pts])})
    return panels


def _range(v) -> list[float]:
    if not v:
        return [0.0, 1.0]
    lo, hi = min(v), max(v)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    return [lo - pad, hi + pad]


def _cd_diagrams(mt: pd.DataFrame, fr: pd.DataFrame, regs) -> list[dict]:
    out = []
    for r in regs:
        f = fr[fr["regime"] == r]
        sub = mt[(mt["regime"] == r) & mt["mean_rank"].notna()].sort_values("mean_rank")
        if f.empty or sub.empty:
            continue
        f = _records_of(f)[0]
        ranks = list(zip(sub["method"], sub["mean_rank"].astype(float)))
        out.append({"regime": r, "k": len(ranks), "ranks": ranks, "cd": f["cd"], "f": f,
                    "cliques": _cliques([v for _, v in ranks], f["cd"])})
    return out


def _cliques(sorted_ranks: list[float], cd) -> list[tuple[int, int]]:
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


# ---------------------------------------------------------------- method page

def _method_page(w: _Writer, t: dict, records, m: str) -> Path:
    mine = [r for r in records if r.method == m]
    hparams = sorted({json.dumps(r.spec.hparams, sort_keys=True, default=str) for r in mine})
    subs = sorted({json.dumps(r.submission, sort_keys=True) for r in mine if r.submission})
    mt = t["methods"][t["methods"]["method"] == m]
    names = sorted({r.spec.method for r in mine})
    ctx = {"title": m, "method": m, "names": names,
           "hparams": [json.loads(h) for h in hparams], "submissions": [json.loads(s) for s in subs],
           "rows": _records_of(mt), "diagnostics": _diagnostics(mine, w.base["regimes"], _captions(names)),
           "runs": _records_of(t["runs"][t["runs"]["method"] == m][["run_id", "dataset", "regime", "order", "seed", "status",
                                                                    "acc", "forgetting", "optimizer_steps", "n_warnings", "warning_codes"]]),
           "downloads": {"per-regime results": w.table(mt, f"method-{slug(m)}")}}
    return w.page("method.html", f"method-{slug(m)}.html", **ctx)


def _series(v) -> list | None:
    """A list of numbers (None allowed), or None when v is not such a list."""
    if isinstance(v, list) and v and all(x is None or _ok(x) for x in v):
        return [float(x) if x is not None else None for x in v]
    return None


def _captions(method_names) -> dict:
    """Diagnostic captions the adapters declare (methods.index: no torch import when cached)."""
    from ..methods.index import method_infos

    try:
        infos = {m["name"]: m for m in method_infos()}
    except Exception:  # a broken submission must not stop the site: captions are decoration
        return {}
    return {k: v for n in method_names for k, v in (infos.get(n, {}).get("captions") or {}).items()}


def _caption(name: str, captions: dict) -> str:
    """The caption of a diagnostic series `key`, `key[i]`, `key.sub` or `key (mean of n)`."""
    base = name.split("[")[0].split(" (")[0].split(".")[0]
    return captions.get(name) or captions.get(base, "")


def _diagnostics(mine: list[RunRecord], regimes, captions: dict | None = None) -> list[dict]:
    """Mean of each numeric diagnostic per (dataset, regime, key), elementwise over runs."""
    acc: dict = {}
    for r in mine:
        if not r.ok:
            continue
        key0 = (r.dataset, r.spec.regime)
        for k, v in (r.diagnostics or {}).items():
            for name, series in _flatten(k, v):
                acc.setdefault(name, {}).setdefault(key0, []).append(series)
    out = []
    pos = {r: i for i, r in enumerate(regimes)}
    for name in sorted(acc):
        rows = []
        for (ds, rg), lst in sorted(acc[name].items(), key=lambda kv: (kv[0][0], pos.get(kv[0][1], 99))):
            rows.append({"dataset": ds, "regime": rg, "n": len(lst), "values": _elementwise_mean(lst)})
        out.append({"name": name, "rows": rows, "width": max(len(r["values"]) for r in rows),
                    "caption": _caption(name, captions or {})})
    return out


def _flatten(k: str, v) -> list[tuple[str, list]]:
    """Numeric diagnostics as named series: a number, a list of numbers, or a list of such lists."""
    if _ok(v):
        return [(k, [float(v)])]
    s = _series(v)
    if s is not None:
        return [(k, s)]
    if isinstance(v, list) and v and all(_series(x) is not None for x in v):
        return [(f"{k}[{i}]", _series(x)) for i, x in enumerate(v)] if len(v) <= 4 else \
            [(f"{k} (mean of {len(v)})", _elementwise_mean([_series(x) for x in v]))]
    if isinstance(v, dict):
        return [pair for kk, vv in v.items() for pair in _flatten(f"{k}.{kk}", vv)]
    return []


def _elementwise_mean(lists: list[list]) -> list:
    width = max(len(x) for x in lists)
    out = []
    for i in range(width):
        vals = [x[i] for x in lists if i < len(x) and x[i] is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


# ---------------------------------------------------------------- run page

def _run_page(w: _Writer, rec: RunRecord, base: dict) -> Path:
    rid = rec.run_id
    norms = rec.update_norms or {}
    ctx = {"title": f"run {rid}", "rec": rec, "spec": rec.spec.to_dict(),
           "cmd": reproduce_command(rid, base["results_dir"]),
           "method": rec.method, "dataset": rec.dataset,
           "matrix": _matrix_cells(rec.acc_matrix or []),
           "norm_rows": _norm_rows(norms), "shared": _series(norms.get("shared")) or [],
           "metrics": rec.metrics or {}, "diagnostics": [
               (name, s) for k, v in (rec.diagnostics or {}).items() for name, s in _flatten(k, v)],
           "warnings": _warning_rows(rec.warnings), "budget": _budget_rows(rec.budget or {})}
    return w.page("run.html", f"runs/{slug(rid)}.html", **ctx)


def _warning_rows(warnings: list) -> list[dict]:
    """A record's warnings with 1-based task numbers and each code's meaning."""
    return [{"task": w["task"] + 1 if _ok(w.get("task")) else None, "code": str(w.get("code", "")),
             "meaning": WARNINGS.get(w.get("code"), ""), "message": str(w.get("message", ""))}
            for w in warnings or [] if isinstance(w, dict)]


def _budget_rows(budget: dict) -> dict:
    """Totals and per-task steps, samples and epochs per training stage of a record's budget."""
    per = [budget.get(k) if isinstance(budget.get(k), list) else [] for k in
           ("steps_per_task", "samples_per_task", "epochs_per_stage")]
    tasks = [{"task": t + 1, "steps": _at(per[0], t), "samples": _at(per[1], t),
              "stages": _stages(_at(per[2], t))}
             for t in range(max(map(len, per)))]
    return {"steps": budget.get("optimizer_steps"), "samples": budget.get("samples_seen"), "tasks": tasks}


def _stages(epochs) -> str:
    """Epochs of a task's training stages as "1 + 1" (one stage: "2")."""
    return " + ".join(map(str, epochs)) if isinstance(epochs, list) else ("" if epochs is None else str(epochs))


def _at(seq: list, i: int):
    """seq[i], or None past its end (a failed run's budget stops at its last task)."""
    return seq[i] if i < len(seq) else None


def _matrix_cells(R: list) -> dict:
    cells = []
    for i, row in enumerate(R):
        for j, v in enumerate(row or []):
            v = v if _ok(v) else None
            a = 0.0 if v is None else max(0.0, min(1.0, v if v <= 1.5 else v / 100))
            cells.append({"i": i, "j": j, "v": v, "fill": _sequential(a) if v is not None else "#e5e5e5",
                          "dark": a > 0.6})
    n = max([len(R)] + [len(r or []) for r in R])
    return {"cells": cells, "rows": len(R), "cols": n}


def _sequential(a: float) -> str:
    """White -> dark teal for accuracy 0 -> 1."""
    lo, hi = (247, 252, 253), (0, 88, 100)
    return "rgb({},{},{})".format(*(round(l + (h - l) * a) for l, h in zip(lo, hi)))


def _norm_rows(norms: dict) -> list[tuple[str, list]]:
    rows = [(k, _series(norms.get(k))) for k in ("shared", "relative", "step_forgetting")]
    rows += [(f"block {b}", _series(v)) for b, v in (norms.get("per_block") or {}).items()]
    return [(k, v) for k, v in rows if v is not None]
