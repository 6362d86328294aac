"""View-model of the contributors of a merged board (leaderboard --bundles): per cell, who ran it, the
verification status the board established, and the hardware. Every string comes from a bundle and is
printed through jinja's autoescape."""
from __future__ import annotations

from collections import defaultdict

STATUS_CLASS = {"verified": "ok", "local": "ok", "rerun differs": "bad"}
# The warning a merged board gives the records of a bundle whose rerun differs (service/bundles.py): it makes
# them flagged, so they are shown and marked; build_site leaves them out of every table and ranking, even under
# include_flagged (leaderboard --include-unverified does not mark them: then they are ranked as any record).
HELD = "rerun-differs"


def held(record) -> bool:
    """Whether the board left `record` out of rankings because its bundle's rerun differs."""
    return any(isinstance(w, dict) and w.get("code") == HELD for w in record.warnings or ())


def rows(records, sources: dict, run_ids=None) -> list[dict]:
    """One row per (dataset, scenario, regime, method, contributor): status, reason, hardware, its runs."""
    if not sources:
        return []
    cells = defaultdict(list)
    for r in records:
        src = sources.get(r.run_id)
        if src is None or (run_ids is not None and r.run_id not in run_ids):
            continue
        key = (r.dataset, str(r.spec.scenario), r.spec.regime, r.method, src.contributor, src.status, src.reason,
               src.hardware, src.bundle)
        cells[key].append(r)
    return [{"dataset": ds, "scenario": sc, "regime": rg, "method": m, "contributor": who, "status": st,
             "status_class": STATUS_CLASS.get(st, ""), "reason": why, "hardware": hw, "bundle": b,
             "runs": sorted(r.run_id for r in recs), "held": any(held(r) for r in recs)}
            for (ds, sc, rg, m, who, st, why, hw, b), recs in sorted(cells.items(), key=lambda kv: kv[0])]


def of_run(sources: dict, run_id: str) -> dict | None:
    """The contributor line of one run page, or None on a board without bundles."""
    src = (sources or {}).get(run_id)
    if src is None:
        return None
    return {"contributor": src.contributor, "status": src.status, "status_class": STATUS_CLASS.get(src.status, ""),
            "reason": src.reason, "hardware": src.hardware, "bundle": src.bundle}


def by_cell(rows: list[dict]) -> dict:
    """{(method, regime): [{contributor, status, status_class}]} of a data set page's contributor rows."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["method"], r["regime"]), []).append(
            {k: r[k] for k in ("contributor", "status", "status_class")})
    return out
