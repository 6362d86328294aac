"""Text the templates print: numbers, p-values, counts, slugs and flag hover texts (jinja2 filters).

Pure functions of one value each; `FILTERS` is what templates.environment() registers.
"""
from __future__ import annotations

import hashlib
import json
import re

from ...config.vocabulary import WARNINGS
from ..charts import fraction_text, ok as _ok


def slug(name: str) -> str:
    """File-name-safe, collision-free slug of any string (readable prefix + short hash)."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", str(name)).strip("-").lower()[:40] or "x"
    return f"{base}-{hashlib.sha1(str(name).encode()).hexdigest()[:6]}"


def p_text(p) -> str:
    """A p-value as shown everywhere: "< 0.001" below 0.001, else three decimals (never "0.0000")."""
    if not _ok(p):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def p_eq(p) -> str:
    """The p filter after a "p": "< 0.001", "= 0.123", or "n/a" when there is none."""
    if not _ok(p):
        return "n/a"
    return p_text(p) if p < 0.001 else f"= {p_text(p)}"


def num(x, digits: int = 3) -> str:
    """Fixed-point text, or an em dash for missing values."""
    return f"{x:.{digits}f}" if _ok(x) else "—"


def value(x, digits: int = 4) -> str:
    """A diagnostic value: whole numbers as integers (memory dimensions, epochs), others fixed-point."""
    return str(int(x)) if _ok(x) and float(x).is_integer() and abs(x) < 1e15 else num(x, digits)


def listing(values) -> str:
    """Distinct values joined by " · " (one value: just it)."""
    return " · ".join(str(v) for v in values) if values else "—"


def thousands(x) -> str:
    """A whole number with thousands separators (1,234), or an em dash for missing values."""
    return f"{round(x):,}" if _ok(x) else "—"


def flag_title(codes: str) -> str:
    """Hover text of a flag mark: each comma-joined warning code with its meaning."""
    items = [c for c in str(codes or "").split(",") if c]
    # Unknown codes (records from another harness version) are shown without a meaning.
    if not items:
        return ""
    return "learning-check warnings: " + "; ".join(f"{c} ({WARNINGS[c]})" if c in WARNINGS else c for c in items)


FILTERS = {"num": num, "pct": lambda x, s=100.0: num(x * s if _ok(x) else x, 1), "slug": slug,
           "tojson_compact": lambda v: json.dumps(v, default=str),
           "tojson_pretty": lambda v: json.dumps(v, indent=1, default=str),
           "thousands": thousands, "flag_title": flag_title, "p": p_text, "p_eq": p_eq,
           "prob": lambda x: num(x, 3), "listing": listing, "val": value, "frac": fraction_text}
