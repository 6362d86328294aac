"""View-models of the sections the overview and the dataset pages share: families and design power."""
from __future__ import annotations

import pandas as pd

from ...analysis.families import ALL as POOLED, families_in
from ...analysis.result import AnalysisResult
from ..charts import records_of


def families(t: AnalysisResult, ds: str | None, regimes) -> dict | None:
    """Within vs across families of one data set (None: all) for the pages; None with one family."""
    fams = families_in(regimes)
    if len(fams) < 2:
        return None
    summary, fw, absent = t.families, t.family_w, t.absent
    rows = {r["kind"]: r for r in records_of(summary[summary["dataset"] == (ds or POOLED)])}
    per_dataset = [{"dataset": d, **{r["kind"]: r for r in records_of(sub)}}
                   for d, sub in summary[summary["dataset"] != POOLED].groupby("dataset", sort=True)]
    absent = records_of(absent if ds is None else absent[absent["dataset"] == ds])
    w = records_of(fw[fw["dataset"] == ds]) if ds is not None else []
    return {"families": fams, "within": rows.get("within"), "across": rows.get("across"), "per_dataset": per_dataset,
            "w": w, "absent": absent}


def power(pw: pd.DataFrame, with_dataset: bool = True) -> dict:
    """Design-power rows, and each warning of the tests that cannot decide with where it applies."""
    rows = records_of(pw)
    bad = [r for r in rows if not r["reachable"]]
    where: dict[str, list[str]] = {}
    for r in bad:
        at = f"{r['dataset']} · {r['regime']}" if with_dataset else str(r["regime"])
        where.setdefault(str(r["message"] or r["test"]), []).append(at)
    return {"rows": rows, "warnings": [{"message": m, "where": w} for m, w in sorted(where.items())],
            "n_bad": len(bad)}
