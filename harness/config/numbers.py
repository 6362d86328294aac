"""What counts as a number wherever values are printed, plotted, logged or aggregated.

Bottom layer on purpose (stdlib only): records hold JSON values, so a metric may be missing
(None), not finite (NaN from a diverged run) or a bool; the analysis, the site, the report, the
figures and the MLflow log all skip such values by this one rule.
"""
from __future__ import annotations

import math


def is_number(x) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
