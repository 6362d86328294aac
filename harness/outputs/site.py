"""Static HTML leaderboard: analysis tables -> jinja2 templates (autoescaped) -> a folder of pages.

Self-contained: CSS, SVG and the one script (table sorting, SVG downloads) are inlined, links
are relative, so the site opens from file:// and can be copied anywhere. Chart geometry is
computed in charts.py as plain numbers; the templates (leaderboard/templates/) only draw it.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import jinja2
import pandas as pd

from ..analysis.families import ALL as POOLED, families_in, regime_table
from ..analysis.frame import FLAG, percent_scale, regime_order
from ..analysis.tables import analyse, headline
from ..config.resources import templates_dir
from ..config.specs import RunRecord
from ..config.text import spreadsheet_safe
from ..config.vocabulary import FAMILY_DESCRIPTIONS, WARNINGS, pretrain_label
from ..execution.reproduce import reproduce_command
from . import charts
from .charts import METHOD_COLOURS, REGIME_COLOURS, ok as _ok, records_of as _records_of

TEMPLATES = templates_dir()
__all__ = ["build_site", "site_summary_line", "slug", "flag_title", "p_text", "METHOD_COLOURS", "REGIME_COLOURS"]


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
                       tojson_pretty=lambda v: json.dumps(v, indent=1, default=str),
                       thousands=_thousands, flag_title=flag_title, p=p_text,
                       p_eq=_p_eq,
                       prob=lambda x: _num(x, 3), listing=_listing, val=_value, frac=charts.fraction_text)
    return env


def p_text(p) -> str:
    """A p-value as shown everywhere: "< 0.001" below 0.001, else three decimals (never "0.0000")."""
    if not _ok(p):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _p_eq(p) -> str:
    """The p filter after a "p": "< 0.001", "= 0.123", or "n/a" when there is none."""
    if not _ok(p):
        return "n/a"
    return p_text(p) if p < 0.001 else f"= {p_text(p)}"


def _value(x, digits: int = 4) -> str:
    """A diagnostic value: whole numbers as integers (memory dimensions, epochs), others fixed-point."""
    return str(int(x)) if _ok(x) and float(x).is_integer() and abs(x) < 1e15 else _num(x, digits)


def _listing(values) -> str:
    """Distinct values joined by " · " (one value: just it)."""
    return " · ".join(str(v) for v in values) if values else "—"


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


def _num(x, digits: int = 3) -> str:
    """Fixed-point text, or an em dash for missing values."""
    return f"{x:.{digits}f}" if _ok(x) else "—"


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
               include_flagged: bool = False, rope: float = 1.0) -> Path:
    """Render the whole leaderboard for a list of records; returns index.html's path.

    Flagged runs (learning-check warnings) are shown and marked everywhere, and left out of
    the rankings unless include_flagged. rope: region of practical equivalence of the Bayesian
    comparisons, in ACC points.
    """
    out = Path(out_dir)
    tables = analyse(records, include_flagged=include_flagged, rope=rope)
    if "curves" not in tables:
        tables = {**tables, "curves": _fallback_curves(records)}
    frame = tables["runs"]
    regimes = regime_order(frame)
    methods = sorted(frame["method"].unique())
    infos = _method_infos()
    base = {"protocol": _protocol(records), "scale": percent_scale(frame), "regimes": regimes,
            "regime_colour": charts.regime_colours(regimes), "regime_info": _regime_info(tables),
            "method_colour": {m: METHOD_COLOURS[i % len(METHOD_COLOURS)] for i, m in enumerate(methods)},
            "datasets": sorted(frame["dataset"].unique()), "methods": methods,
            "results_dir": results_dir, "include_flagged": include_flagged, "flag": FLAG,
            "warning_text": WARNINGS, "scenarios": sorted({r.spec.scenario for r in records}), "rope": rope}
    with _Writer(out, _env(), base) as w:  # on leaving: files of the previous build not rewritten go
        index = _overview(w, tables, records)
        for ds in base["datasets"]:
            _dataset_page(w, tables, ds)
        for m in methods:
            _method_page(w, tables, records, m, infos)
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


def _fallback_curves(records) -> pd.DataFrame:
    """Mean seen-task accuracy per task, CI = min/max over runs (no bootstrap).

    Stand-in only: the analysis table tables["curves"] (harness/analysis/curves.py) replaces it
    whenever analyse() provides one.
    """
    groups: dict[tuple, list[list]] = {}
    for rec in records:
        if rec.ok and rec.acc_matrix:
            rows = [[v for v in (row or [])[:t + 1] if _ok(v)] for t, row in enumerate(rec.acc_matrix)]
            seen = [sum(r) / len(r) if len(r) == t + 1 else None for t, r in enumerate(rows)]
            groups.setdefault((rec.dataset, rec.spec.regime, rec.method), []).append(seen)
    out = []
    for (ds, rg, m), curves in sorted(groups.items()):
        for t in range(max(len(c) for c in curves)):
            v = [c[t] for c in curves if t < len(c) and c[t] is not None]
            if v:
                out.append({"dataset": ds, "regime": rg, "method": m, "task": t + 1, "n": len(v),
                            "acc": sum(v) / len(v), "acc_lo": min(v), "acc_hi": max(v)})
    return pd.DataFrame(out, columns=["dataset", "regime", "method", "task", "n", "acc", "acc_lo", "acc_hi"])


def _method_infos() -> dict[str, dict]:
    """Adapter metadata by registry name (methods.index: no torch import when cached); {} if unavailable."""
    from ..api.index import method_infos

    try:
        return {m["name"]: m for m in method_infos()}
    except Exception:  # a broken submission must not stop the site: descriptions are decoration
        return {}


def _present(t: dict, key: str) -> pd.DataFrame | None:
    """An optional analysis table, or None when this analysis does not provide it."""
    df = t.get(key)
    return df if isinstance(df, pd.DataFrame) else None


def _regime_info(t: dict) -> dict[str, dict]:
    """Per regime: its family, the median trainable fraction and count over data sets, and each
    data set's own (backbones differ between data sets, so do their fractions)."""
    rt = _present(t, "regimes")
    rt = regime_table(t["runs"]) if rt is None else rt
    out = {}
    for rg, sub in rt.groupby("regime", sort=False):
        per = [{"dataset": r["dataset"], "fraction": r["fraction"], "trainable": r["trainable"], "total": r["total"]}
               for r in _records_of(sub)]
        out[rg] = {"family": str(sub["family"].iloc[0]), "fraction": _clean(sub["fraction"].median()),
                   "trainable": _clean(sub["trainable"].median()), "per_dataset": per,
                   "same": len({(r["fraction"], r["trainable"]) for r in per}) <= 1}
    return out


def _clean(x):
    """A float for JSON and templates (NaN -> None)."""
    return charts.clean(float(x)) if x is not None else None


def _families(t: dict, ds: str | None, regimes) -> dict | None:
    """Within vs across families of one data set (None: all) for the pages; None with one family."""
    fams = families_in(regimes)
    summary, fw = _present(t, "families"), _present(t, "family_w")
    if len(fams) < 2 or summary is None:
        return None
    rows = {r["kind"]: r for r in _records_of(summary[summary["dataset"] == (ds or POOLED)])}
    per_dataset = [{"dataset": d, **{r["kind"]: r for r in _records_of(sub)}}
                   for d, sub in summary[summary["dataset"] != POOLED].groupby("dataset", sort=True)]
    absent = _present(t, "absent")
    absent = _records_of(absent if ds is None else absent[absent["dataset"] == ds]) if absent is not None else []
    w = _records_of(fw[fw["dataset"] == ds]) if fw is not None and ds is not None else []
    return {"families": fams, "within": rows.get("within"), "across": rows.get("across"), "per_dataset": per_dataset,
            "w": w, "absent": absent}


def _degenerate_map(t: dict, ds: str) -> dict[str, str]:
    """{regime: reason} of the dataset's degenerate regimes (none when the analysis has no such table)."""
    deg = _present(t, "degenerate")
    if deg is None or deg.empty:
        return {}
    sub = deg[(deg["dataset"] == ds) & deg["degenerate"].astype(bool)]
    return {r: str(why or "all methods tie") for r, why in zip(sub["regime"], sub["reason"])}


# ---------------------------------------------------------------- overview

def _overview(w: _Writer, t: dict, records) -> Path:
    frame = t["runs"]
    status = frame.groupby(["dataset", "status"]).size().unstack(fill_value=0)
    flagged_per = frame.groupby("dataset")["flagged"].sum()
    gr = t["global_ranks"]
    downloads = {"global ranking": w.table(gr, "global_ranks"), "coverage": w.table(t["coverage"], "coverage"),
                 "all runs": w.table(frame, "runs"), "agreement (W across regimes)": w.table(t["w_regimes"], "w_regimes"),
                 "flagged runs": w.table(t["flagged"], "flagged"), "training budget": w.table(t["budget"], "budget")}
    downloads.update({name: w.table(t[key], key) for name, key in (
        ("design power", "power"), ("credible reversals", "credible_reversals"),
        ("degenerate regimes", "degenerate"), ("regimes (family, trainable fraction)", "regimes"),
        ("within vs across families", "families"), ("τ by family pair", "family_tau"),
        ("W per family", "family_w"), ("methods absent by design", "absent")) if _present(t, key) is not None})
    ctx = {
        "title": "Overview", "n_runs": len(frame),
        "status_counts": frame["status"].value_counts().to_dict(),
        "status_table": [{"dataset": ds, **{k: int(v) for k, v in row.items()}, "_flagged": int(flagged_per[ds])}
                         for ds, row in status.iterrows()],
        "statuses": list(status.columns),
        "headline": headline(t), "setup": _setup(records, frame),
        "families": _families(t, None, w.base["regimes"]),
        "family_descriptions": {f: FAMILY_DESCRIPTIONS.get(f, "") for f in families_in(w.base["regimes"])},
        "power": _power(_present(t, "power")), "bayes_blind": _bayes_blind(_present(t, "power")),
        "flagged": _records_of(t["flagged"]), "budget": _budget_summary(t["budget"]),
        "unranked": [r for r in w.base["regimes"] if r not in set(gr["regime"])],
        "global": {rg: _records_of(sub) for rg, sub in gr.groupby("regime", sort=False)},
        "global_chart": charts.rank_whiskers(gr, w.base["regimes"]),
        "failed": _records_of(frame[frame["status"] != "ok"][["run_id", "dataset", "regime", "method", "order", "seed", "status", "error"]]),
        "w_regimes": _records_of(t["w_regimes"]),
        "downloads": downloads,
    }
    return w.page("index.html", "index.html", **ctx)


def _setup(records, frame: pd.DataFrame) -> dict:
    """Scenario, pre-training and training budget of the records' specs (every distinct value)."""
    specs = [r.spec for r in records]

    def values(get) -> list:
        return sorted({_text(get(s)) for s in specs}, key=str)

    ok_steps = frame.loc[frame["status"] == "ok", "optimizer_steps"].dropna() if "optimizer_steps" in frame else []
    # A pretrained backbone is a mapping ({dataset: ..} or {checkpoint: .., sha256: ..}): shown by its label.
    return {"scenario": values(lambda s: s.scenario), "pretrain": values(lambda s: pretrain_label(s.pretrain)),
            "epochs": values(lambda s: s.training.epochs), "batch_size": values(lambda s: s.training.batch_size),
            "optimizer": values(lambda s: s.training.optimizer), "lr": values(lambda s: s.training.lr),
            "momentum": values(lambda s: s.training.momentum),
            "weight_decay": values(lambda s: s.training.weight_decay),
            "steps": float(ok_steps.mean()) if len(ok_steps) else None}


def _text(v) -> str:
    """A spec value as one line (mappings as compact JSON: `{checkpoint: PATH}` pre-training)."""
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list)) else str(v)


def _power(pw: pd.DataFrame | None, with_dataset: bool = True) -> dict | None:
    """Design-power rows, and each warning of the tests that cannot decide with where it applies
    (None: the analysis has no power table)."""
    if pw is None:
        return None
    rows = _records_of(pw)
    bad = [r for r in rows if not r["reachable"]]
    where: dict[str, list[str]] = {}
    for r in bad:
        at = f"{r['dataset']} · {r['regime']}" if with_dataset else str(r["regime"])
        where.setdefault(str(r["message"] or r["test"]), []).append(at)
    return {"rows": rows, "warnings": [{"message": m, "where": w} for m, w in sorted(where.items())],
            "n_bad": len(bad)}


def _bayes_blind(pw: pd.DataFrame | None) -> dict:
    """How many (dataset, regime) Bayesian comparisons cannot reach the credible level at all:
    there, "no credible reversal" says nothing about agreement."""
    if pw is None or pw.empty:
        return {"n": 0, "of": 0}
    b = pw[pw["test"] == "bayes-signed-rank"]
    return {"n": int((~b["reachable"].astype(bool)).sum()), "of": len(b)}


def _budget_summary(budget: pd.DataFrame) -> dict:
    """Per-method budget rows, and whether methods differ (the overview shows the table only then)."""
    rows = _records_of(budget)
    rel = [r["relative_steps"] for r in rows if r["relative_steps"] is not None]
    # 1% slack: steps follow the sample counts, which differ a little between task orders.
    return {"rows": rows, "differs": bool(rel) and max(rel) - min(rel) > 0.01}


# ---------------------------------------------------------------- dataset page

DATASET_DOWNLOADS = (("method x regime", "methods"), ("Kendall tau", "tau"), ("rank reversals", "reversals"),
                     ("credible reversals", "credible_reversals"), ("Bayesian comparisons", "bayes"),
                     ("design power", "power"), ("degenerate regimes", "degenerate"), ("accuracy curves", "curves"),
                     ("Friedman + CD", "friedman"), ("Nemenyi pairwise p", "nemenyi"), ("W across orders", "w_orders"),
                     ("norm vs forgetting", "norm_forgetting"), ("norm vs forgetting per family", "norm_forgetting_family"),
                     ("regimes (family, trainable fraction)", "regimes"), ("within vs across families", "family_tau"),
                     ("W per family", "family_w"), ("depth profile", "depth_profile"),
                     ("depth trend", "depth_trend"), ("step level", "step_level"), ("runs", "runs"))


def _dataset_page(w: _Writer, t: dict, ds: str) -> Path:
    sel = {k: v[v["dataset"] == ds] for k, v in t.items() if isinstance(v, pd.DataFrame) and "dataset" in v.columns}
    s = slug(ds)
    regs = [r for r in w.base["regimes"] if r in set(sel["methods"]["regime"])]
    deg = _degenerate_map(t, ds)
    colours = w.base["method_colour"]
    fractions = {r["regime"]: r["fraction"] for r in _records_of(sel["regimes"])} if "regimes" in sel else None
    ctx = {
        "title": ds, "dataset": ds, "regs": regs, "degenerate": deg,
        "grid": _grid(sel["methods"], regs, deg, _regime_cells(sel.get("regimes"))),
        "rows": _records_of(sel["methods"]),
        "tau": charts.heatmap(sel["tau"], regs, deg),
        "rank_shift": charts.rank_shift(sel["methods"], regs, colours, fractions),
        "families": _families(t, ds, regs),
        "family_descriptions": {f: FAMILY_DESCRIPTIONS.get(f, "") for f in families_in(regs)},
        "regime_rows": _records_of(sel["regimes"]) if "regimes" in sel else [],
        "nf_family": _records_of(sel["norm_forgetting_family"]) if "norm_forgetting_family" in sel else [],
        "curves": charts.curve_panels(sel.get("curves"), regs, colours, w.base["scale"]),
        "credible": _records_of(sel["credible_reversals"]) if "credible_reversals" in sel else None,
        "bayes": _bayes_matrices(sel["bayes"], regs) if "bayes" in sel else None,
        "power": _power(sel.get("power"), with_dataset=False),
        "wilcoxon_decides": _wilcoxon_decides(sel.get("power")),
        "scatter": charts.scatter(sel["runs"], sel["norm_forgetting"], regs),
        "profile": {k: charts.fraction_profile(_records_of(sel["depth_profile"]), k, f, w.base["regime_colour"], label)
                    for k, f, label in (("norm", 1.0, "mean update norm"),
                                        ("forgetting", w.base["scale"], "forgetting" + (" %" if w.base["scale"] == 100 else "")))},
        "trend": _records_of(sel["depth_trend"]),
        "cd": charts.cd_diagrams(sel["methods"], sel["friedman"], regs),
        "friedman": _records_of(sel["friedman"]), "w_orders": _records_of(sel["w_orders"]),
        "w_regimes": _records_of(sel["w_regimes"]), "reversals": _records_of(sel["reversals"]),
        "reversal_summary": _records_of(sel["reversal_summary"]),
        "norm_forgetting": _records_of(sel["norm_forgetting"]), "step_level": _records_of(sel["step_level"]),
        "downloads": {name: w.table(sel[key], f"{s}-{key}") for name, key in DATASET_DOWNLOADS if key in sel},
    }
    return w.page("dataset.html", f"dataset-{s}.html", **ctx)


def _wilcoxon_decides(power: pd.DataFrame | None) -> bool:
    """Whether the Holm-corrected Wilcoxon tests can call anything significant with these blocks."""
    if power is None or power.empty:
        return True
    rows = power[power["test"] == "wilcoxon-holm"]
    return bool(rows["reachable"].all())


def _regime_cells(rt: pd.DataFrame | None) -> dict:
    """{regime: {family, fraction}} of one data set's regime table (empty without one)."""
    return {} if rt is None else {r["regime"]: {"family": r["family"], "fraction": r["fraction"]} for r in _records_of(rt)}


def _grid(mt: pd.DataFrame, regs, degenerate: dict, info: dict | None = None) -> dict:
    """Method x regime cells (ACC, CI, forgetting, flags); the best mean ACC of each regime marked;
    per regime its family and trainable fraction (info: _regime_cells).

    A degenerate regime marks no best: every method ties there.
    """
    rows = {m: {} for m in sorted(mt["method"].unique())}
    for r in _records_of(mt):
        rows[r["method"]][r["regime"]] = r
    best = {}
    for rg in regs:
        accs = [c[rg]["acc"] for c in rows.values() if rg in c and c[rg]["acc"] is not None]
        best[rg] = max(accs) if accs and rg not in degenerate else None
    out = []
    for m, cells in rows.items():
        out.append({"method": m, "cells": [_grid_cell(cells.get(rg), best[rg]) for rg in regs]})
    info = info or {}
    return {"rows": out, "regs": [{"name": rg, "degenerate": degenerate.get(rg, ""),
                                   "family": info.get(rg, {}).get("family", ""),
                                   "fraction": info.get(rg, {}).get("fraction")} for rg in regs]}


def _grid_cell(r: dict | None, best) -> dict | None:
    """One grid cell: the metric row plus whether it holds the column's best mean ACC."""
    if r is None:
        return None
    half = (r["acc_hi"] - r["acc_lo"]) / 2 if r["acc_hi"] is not None and r["acc_lo"] is not None else None
    # Ties within float noise share the mark.
    top = best is not None and r["acc"] is not None and r["acc"] >= best - 1e-12
    return {**r, "half": half, "best": top}


def _bayes_matrices(bayes: pd.DataFrame, regs) -> list[dict]:
    """Per regime: the pairwise P(row better) / P(equal) / P(column better) matrix and the decided pairs."""
    out = []
    for rg in regs:
        sub = _records_of(bayes[bayes["regime"] == rg])
        if not sub:
            continue
        methods = sorted({r["method_1"] for r in sub} | {r["method_2"] for r in sub})
        cell = {}
        for r in sub:  # both orientations: row i vs column j reads P(i better), P(equal), P(j better)
            win = {"method_1": "row", "method_2": "col"}.get(r["decision"], r["decision"])
            cell[(r["method_1"], r["method_2"])] = {"better": r["p_1"], "equal": r["p_rope"], "worse": r["p_2"],
                                                    "decision": win, "diff": r["diff"], "n": r["n_blocks"]}
            flip = {"row": "col", "col": "row"}.get(win, win)
            cell[(r["method_2"], r["method_1"])] = {"better": r["p_2"], "equal": r["p_rope"], "worse": r["p_1"],
                                                    "decision": flip, "diff": -r["diff"] if _ok(r["diff"]) else None,
                                                    "n": r["n_blocks"]}
        decided = [r for r in sub if r["decision"] in ("method_1", "method_2", "equal")]
        out.append({"regime": rg, "methods": methods, "cell": {f"{a}\x00{b}": v for (a, b), v in cell.items()},
                    "decided": decided, "n_pairs": len(sub), "rope": sub[0]["rope"]})
    return out


# ---------------------------------------------------------------- method page

def _method_page(w: _Writer, t: dict, records, m: str, infos: dict) -> Path:
    mine = [r for r in records if r.method == m]
    hparams = sorted({json.dumps(r.spec.hparams, sort_keys=True, default=str) for r in mine})
    subs = sorted({json.dumps(r.submission, sort_keys=True) for r in mine if r.submission})
    mt = t["methods"][t["methods"]["method"] == m]
    names = sorted({r.spec.method for r in mine})
    captions = {k: v for n in names for k, v in (infos.get(n, {}).get("captions") or {}).items()}
    about = [{"name": n, "description": str(infos[n].get("description") or ""),
              "reference": str(infos[n].get("reference") or "")} for n in names if n in infos]
    ctx = {"title": m, "method": m, "names": names, "about": about,
           "hparams": [json.loads(h) for h in hparams], "submissions": [json.loads(s) for s in subs],
           "rows": _records_of(mt), "diagnostics": _diagnostics(mine, w.base["regimes"], captions),
           "sweeps": _sweeps(mine, w.base["regimes"], w.base["scale"], captions),
           "runs": _records_of(t["runs"][t["runs"]["method"] == m][["run_id", "dataset", "regime", "order", "seed", "status",
                                                                    "acc", "forgetting", "optimizer_steps", "n_warnings", "warning_codes"]]),
           "downloads": {"per-regime results": w.table(mt, f"method-{slug(m)}")}}
    return w.page("method.html", f"method-{slug(m)}.html", **ctx)


def _series(v) -> list | None:
    """A list of numbers (None allowed), or None when v is not such a list."""
    if isinstance(v, list) and v and all(x is None or _ok(x) for x in v):
        return [float(x) if x is not None else None for x in v]
    return None


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
    """Numeric diagnostics as named series: a number, a list of numbers, a list of such lists,
    a dict of those, or a per-task list of dicts (one series per key). Sweeps are charts instead."""
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
    if _is_sweep(v) or not _per_task_dicts(v):
        return []
    keys = sorted({kk for x in v if isinstance(x, dict) for kk, vv in x.items() if _ok(vv)})
    return [(f"{k}.{kk}", [float(x[kk]) if isinstance(x, dict) and _ok(x.get(kk)) else None for x in v])
            for kk in keys]


def _per_task_dicts(v) -> bool:
    """A list of dicts (None allowed) with at least one dict: a per-task nested diagnostic."""
    return isinstance(v, list) and any(isinstance(x, dict) for x in v) and all(x is None or isinstance(x, dict) for x in v)


def _is_sweep(v) -> bool:
    """A per-task list of {..., "grid": [{param: x, quantity: y}, ...]} (BECAME's alpha_sweep)."""
    return _per_task_dicts(v) and all(isinstance(x.get("grid"), list) and x["grid"]
                                      and all(isinstance(p, dict) for p in x["grid"])
                                      for x in v if isinstance(x, dict))


def _sweep_keys(entry: dict) -> tuple[str, str] | None:
    """(swept parameter, measured quantity) of one sweep entry.

    The parameter is the grid key the entry also records as a scalar (BECAME: `alpha`, the chosen value).
    """
    keys = sorted({k for p in entry["grid"] for k, v in p.items() if _ok(v)})
    if len(keys) < 2:
        return None
    x = next((k for k in keys if _ok(entry.get(k))), "alpha" if "alpha" in keys else keys[0])
    return x, next(k for k in keys if k != x)


def _sweeps(mine: list[RunRecord], regimes, scale: float, captions: dict | None = None) -> list[dict]:
    """Swept diagnostics as charts: per (key, dataset, regime), the mean curve of each task over runs."""
    slots: dict = {}
    for r in mine:
        if not r.ok:
            continue
        for k, v in (r.diagnostics or {}).items():
            if _is_sweep(v):
                _add_sweep(slots, (k, r.dataset, r.spec.regime), v)
    pos = {r: i for i, r in enumerate(regimes)}
    out = []
    for (k, ds, rg), slot in sorted(slots.items(), key=lambda kv: (kv[0][0], kv[0][1], pos.get(kv[0][2], 99))):
        if slot["tasks"]:
            out.append({"key": k, "dataset": ds, "regime": rg, "caption": _caption(k, captions or {}),
                        **charts.sweep_panel(slot, scale)})
    return out


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
            if _ok(p.get(xk)) and _ok(p.get(yk)):
                task["pts"].setdefault(round(float(p[xk]), 9), []).append(float(p[yk]))
        for name, val in entry.items():
            if name != "grid" and _ok(val):
                task["marks"].setdefault(name, []).append(float(val))


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
           "matrices": _matrices(rec), "metric_rows": _metric_rows(rec),
           "norm_rows": _norm_rows(norms), "shared": _series(norms.get("shared")) or [],
           "diagnostics": [(name, s) for k, v in (rec.diagnostics or {}).items() for name, s in _flatten(k, v)],
           "sweeps": _sweeps([rec], base["regimes"], base["scale"]) if _has_sweep(rec) else [],
           "timings": _timings(rec.timings or {}), "provenance": _provenance(rec.provenance or {}),
           "warnings": _warning_rows(rec.warnings), "budget": _budget_rows(rec.budget or {})}
    return w.page("run.html", f"runs/{slug(rid)}.html", **ctx)


def _has_sweep(rec: RunRecord) -> bool:
    return any(_is_sweep(v) for v in (rec.diagnostics or {}).values())


def _matrices(rec: RunRecord) -> list[dict]:
    """The accuracy matrix; for a class-IL run also the task-aware (masked) one, labelled."""
    aware = getattr(rec, "acc_matrix_task_aware", None)
    if aware is None:
        return [{"label": "", "m": charts.matrix_cells(rec.acc_matrix or []), "slug": "accuracy-matrix"}]
    return [{"label": "class-IL (no task id at test time)", "m": charts.matrix_cells(rec.acc_matrix or []),
             "slug": "accuracy-matrix-class-il"},
            {"label": "task-aware (predictions masked to the task's classes)", "m": charts.matrix_cells(aware),
             "slug": "accuracy-matrix-task-aware"}]


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
        if _ok(v):
            out.append((k, f"{v:.2f}"))
        elif isinstance(v, list):
            out.append((k, ", ".join(f"{x:.2f}" if _ok(x) else "—" for x in v)))
        else:
            out.append((k, json.dumps(v, default=str)))
    return out


def _provenance(prov: dict) -> list[dict]:
    """Provenance rows: text, a flat mapping as inline pairs, anything nested as a JSON box."""
    rows = []
    for k, v in prov.items():
        if isinstance(v, dict) and all(not isinstance(x, (dict, list)) for x in v.values()):
            rows.append({"key": k, "pairs": [(kk, "" if vv is None else str(vv)) for kk, vv in v.items()]})
        elif isinstance(v, (dict, list)):
            rows.append({"key": k, "json": v})
        else:
            rows.append({"key": k, "text": "" if v is None else str(v)})
    return rows


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


def _norm_rows(norms: dict) -> list[tuple[str, list]]:
    rows = [(k, _series(norms.get(k))) for k in ("shared", "relative", "step_forgetting")]
    rows += [(f"block {b}", _series(v)) for b, v in (norms.get("per_block") or {}).items()]
    return [(k, v) for k, v in rows if v is not None]
