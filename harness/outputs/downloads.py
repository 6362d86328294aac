"""What a written table holds: the any-time columns only where some run has a continual-evaluation curve.

The tidy frame (analysis/frame.py) and the metric tables (analysis/tables.py) always carry the any-time
columns (has_curve, each config/metrics.py ANYTIME metric and its CI bounds `<name>_lo`/`<name>_hi`), NaN
for a run without a curve. A table written for users (`cl-bench export`, the site's CSV/JSON downloads)
drops them when no run has a curve, so without curves every such file is byte-identical to what
cl-bench wrote before continual evaluation existed. The decision is made once per export or site (over
all its runs), so the downloads of one site share their columns.
"""
from __future__ import annotations

import pandas as pd

from ..config.metrics import ANYTIME_NAMES

CURVE_FLAG = "has_curve"  # the frame's column: the record carries a continual-evaluation curve
ANYTIME_COLUMNS = frozenset({CURVE_FLAG, *(f"{name}{end}" for name in ANYTIME_NAMES for end in ("", "_lo", "_hi"))})


def has_curves(runs: pd.DataFrame) -> bool:
    """Whether some run of a tidy frame (records_to_frame) carries a continual-evaluation curve."""
    return bool(CURVE_FLAG in runs and runs[CURVE_FLAG].astype(bool).any())


def for_download(df: pd.DataFrame, curves: bool) -> pd.DataFrame:
    """df as written for users: without its any-time columns (ANYTIME_COLUMNS) when `curves` is False
    (no run of the export or site has a curve), else unchanged."""
    if curves:
        return df
    drop = [c for c in df.columns if c in ANYTIME_COLUMNS]
    return df.drop(columns=drop) if drop else df
